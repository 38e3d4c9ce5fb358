"""The CPU split's caps (core/cpu_split.py): fed fake telemetry (a slow CPU, a fast one, none), the caps move blocks
the expected way; and an engine on the CPU device whose worker is slowed learns to move blocks to the zero-copy
share, with every output still the merge of the same parts."""

import math

import pytest
import torch

from support import requires_cuda

from scout_sglang.config import ScoutConfig
from scout_sglang.core.cpu_split import CpuSplit, workers_share
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape
from scout_sglang.cpu_worker.faults import FaultPlan

BLOCK_BYTES = 2 * 32 * 128 * 2  # K + V of a 32-token block of one KV head, bf16
CAPACITY = 16
ROWS = 64  # (row, KV head) lists in a step
GBS = 1e9


def split(setting="auto", **kwargs):
    return CpuSplit(setting, layers=(1, 2), capacity=CAPACITY, block_bytes=BLOCK_BYTES, link_gbs=50.0, **kwargs)


def listed_bytes(blocks_per_row=8):
    return blocks_per_row * ROWS * BLOCK_BYTES


def test_until_a_rate_is_measured_the_workers_take_every_block():
    caps = split()
    assert caps.step_caps() == [CAPACITY, CAPACITY] and "start-up" in caps.source


def test_a_slow_cpu_gives_the_device_what_the_workers_cannot_finish_in_their_window():
    caps = split()
    window = 100e-6
    # 8 blocks per row took the window and a wait as long again: the workers run at B / 2W
    caps.observe(1, cpu_blocks=8 * ROWS, zero_copy_blocks=0, rows=ROWS, steps=1, window_s=window, wait_s=window)
    rate = listed_bytes() / (2 * window)
    assert caps.cpu_bps[1] == pytest.approx(rate)
    share = max(rate * window / listed_bytes(), rate / (rate + 50 * GBS))
    assert caps.step_caps() == [math.ceil(share * 8), CAPACITY]  # layer 2 has no rate yet
    assert caps.step_caps()[0] < 8 and "measured" in caps.source


def test_a_much_slower_cpu_keeps_the_balancing_share_not_less():
    caps = split()
    caps.observe(1, cpu_blocks=8 * ROWS, zero_copy_blocks=0, rows=ROWS, steps=1, window_s=1e-6, wait_s=1e-3)
    rate = caps.cpu_bps[1]
    balanced = rate / (rate + 50 * GBS)
    assert workers_share(listed_bytes(), 1e-6, rate, 50 * GBS) == pytest.approx(balanced)
    assert caps.step_caps()[0] == math.ceil(balanced * 8)


def test_a_fast_cpu_takes_every_block_again():
    caps = split()
    caps.observe(1, cpu_blocks=8 * ROWS, zero_copy_blocks=0, rows=ROWS, steps=1, window_s=100e-6, wait_s=100e-6)
    assert caps.step_caps()[0] < CAPACITY
    # split now, and the workers are done well inside the window (no wait): the cap probes up a block a step
    seen = []
    for _ in range(CAPACITY):
        cap = caps.step_caps()[0]
        seen.append(cap)
        caps.observe(1, cpu_blocks=min(cap, 8) * ROWS, zero_copy_blocks=(8 - min(cap, 8)) * ROWS, rows=ROWS, steps=1,
                     window_s=100e-6, wait_s=0.0)
    assert seen == sorted(seen) and seen[1] == seen[0] + 1
    assert caps.cpu_bps[1] >= 3 * ROWS * BLOCK_BYTES / 100e-6
    assert caps.step_caps()[0] == CAPACITY


def test_the_zero_copy_reads_own_rate_replaces_the_start_up_one_while_serving():
    caps = split()
    assert caps.describe()["link_gbs"] == 50.0 and caps.describe()["link_source"] == "configured"
    blocks = 8 * ROWS  # 1 MiB: at 20 GB/s, 52 us
    caps.observe(1, cpu_blocks=0, zero_copy_blocks=blocks, rows=ROWS, steps=1, window_s=1e-3, wait_s=0.0,
                 zero_copy_s=blocks * BLOCK_BYTES / (20 * GBS))
    assert caps.link_bps == pytest.approx(35 * GBS)  # half way: the moving estimate
    assert "measured while serving" in caps.describe()["link_source"]
    for _ in range(20):
        caps.observe(1, cpu_blocks=0, zero_copy_blocks=blocks, rows=ROWS, steps=1, window_s=1e-3, wait_s=0.0,
                     zero_copy_s=blocks * BLOCK_BYTES / (20 * GBS))
    assert caps.link_bps == pytest.approx(20 * GBS, rel=1e-3)
    # reads shorter than MIN_LINK_SAMPLE_S per step measure latency, not the link: no update
    caps.observe(1, cpu_blocks=0, zero_copy_blocks=2, rows=ROWS, steps=1, window_s=1e-3, wait_s=0.0, zero_copy_s=1e-6)
    assert caps.link_bps == pytest.approx(20 * GBS, rel=1e-3)


def test_without_a_worker_or_when_the_circuit_bypasses_it_the_device_reads_every_block():
    assert split(workers=False).step_caps() == [0, 0]
    assert split().step_caps(bypass=True) == [0, 0]


def test_a_fixed_share_is_of_the_capacity_and_never_moves():
    caps = split("0.25")
    caps.observe(1, cpu_blocks=8 * ROWS, zero_copy_blocks=0, rows=ROWS, steps=1, window_s=1e-6, wait_s=1e-3)
    assert caps.step_caps() == [4, 4] == caps.step_caps(bypass=True)


def test_an_engine_with_a_slow_worker_moves_blocks_to_the_zero_copy_share():
    """The CPU device, the real worker made slow (a 20 ms sleep per part, against a window of microseconds): after
    the first measured steps the caps fall and the device reads blocks itself; no part falls back."""
    shape = ModelShape(num_layers=3, num_qo_heads=4, num_kv_heads=2, head_dim=16)
    config = ScoutConfig(mode="scout", block_size=8, token_budget=64, sink_blocks=1, local_blocks=1, cpu_groups=1,
                         resident_blocks=2, recall_policy="off", cpu_split="auto")
    engine = CoAttentionEngine(config, shape, dtype=torch.float32, max_requests=2, max_tokens_per_request=256,
                               cpu_deadline_ms=2000, cpu_faults=FaultPlan(delay_probability=1.0, delay_ms=20.0))
    gen = torch.Generator().manual_seed(0)
    try:
        for rid in range(2):
            engine.add_request(rid)
            for layer in range(3):
                engine.prefill(rid, layer, *(torch.randn(200, 2, 16, generator=gen) for _ in range(2)))
        steps, caps = [], []
        for _ in range(4):
            engine.begin_step([0, 1])
            for layer in range(3):
                q, k, v = torch.randn(2, 4, 16, generator=gen), *(torch.randn(2, 2, 16, generator=gen) for _ in range(2))
                engine.attend(layer, q, k, v)
            steps.append(engine.end_step())
            caps.append(min(engine.cpu_split.step_caps()))
        totals = [step.totals() for step in steps]
        assert totals[0].zero_copy_blocks == 0 and totals[0].cpu_blocks > 0  # the start-up default: all to the CPU
        # once measured, the device reads blocks itself. Auto then follows the rate it measures for those reads,
        # so on a loaded host (the CPU device's reads slowed as well) a later step may hand them back to the CPU
        moved = [t for t in totals[1:] if t.zero_copy_blocks > 0]
        assert moved, [t.zero_copy_blocks for t in totals]
        assert all(t.zero_copy_s > 0 for t in moved)  # the device's reads are timed; their rate replaces start-up's
        assert "measured while serving" in engine.cpu_split.describe()["link_source"]
        assert min(caps) < config.cpu_capacity, caps
        assert not any(step.cpu_fallbacks for step in steps)  # slow, never late: the deadline is 2 s
    finally:
        engine.close()


@requires_cuda
def test_on_a_gpu_auto_times_the_zero_copy_reads_once_at_start_up():
    shape = ModelShape(num_layers=2, num_qo_heads=8, num_kv_heads=2, head_dim=64)
    config = ScoutConfig(mode="scout", block_size=16, token_budget=256, cpu_groups=1, cpu_split="auto")
    engine = CoAttentionEngine(config, shape, device="cuda", dtype=torch.bfloat16, max_requests=8,
                               max_tokens_per_request=4096)
    try:
        split = engine.cpu_split.describe()
        assert split["link_source"] == "calibrated at start-up" and split["link_gbs"] > 1.0, split
    finally:
        engine.close()
