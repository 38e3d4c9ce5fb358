"""The server's co-attention statistics add up inside the layer loop without reading the device."""

import pytest
import torch

from scout_sglang.core.op_counter import OpCounter
from scout_sglang.sglang_adapter.serving_stats import ServingStats


def test_cosines_are_summed_on_the_device_and_read_once_by_a_report():
    stats = ServingStats()
    layers = [torch.tensor([0.5, 1.0, 0.0]), torch.tensor([0.25, 0.75, 1.0])]
    with OpCounter() as counter:  # what a decode step's layers do: no scalar read (a device sync on a GPU)
        for cosines in layers:
            stats.add_cosines(cosines)
    assert counter.scalar_reads == 0
    assert stats.report({})["predicted_query_cosine"] == pytest.approx(3.5 / 6)


def test_no_cosine_reports_none():
    assert ServingStats().report({})["predicted_query_cosine"] is None


def telemetry_of(*, steps, cpu, budget, recall_bytes, cap, backed_off, rows):
    from scout_sglang.core.telemetry import StepTelemetry

    telemetry = StepTelemetry(0, 2, steps=steps, recall_cap_bytes=cap)
    layer = telemetry.layer(1)
    layer.cpu_blocks, layer.budget_blocks, layer.recall_bytes = cpu, budget, recall_bytes
    layer.backed_off_rows, layer.recall_rows, layer.withheld_blocks = backed_off, rows, 3 * steps
    return telemetry


def test_the_recall_section_looks_at_the_recent_steps_only():
    stats = ServingStats()
    for _ in range(100):  # thrash long ago: everything on the CPU, recall at its cap
        stats.add_step(telemetry_of(steps=1, cpu=64, budget=64, recall_bytes=1000, cap=1000, backed_off=0, rows=8))
    for _ in range(64):  # now: settled, the brake holds half the rows
        stats.add_step(telemetry_of(steps=2, cpu=8, budget=128, recall_bytes=100, cap=2000, backed_off=8, rows=16))
    recall = stats.report({})["recall"]
    assert recall == {"recent_steps": 128, "recent_cpu_ratio": 0.0625, "bytes_per_step": 50, "cap_bytes_per_step": 1000,
                      "withheld_blocks_per_step": 3.0, "backed_off_fraction": 0.5}
    assert stats.report({})["cpu_ratio"] == round((100 * 64 + 64 * 8) / (100 * 64 + 64 * 128), 4)  # since start-up


def test_the_cpu_split_section_gives_bytes_and_the_wait_per_recent_step():
    stats = ServingStats()
    for _ in range(64):  # before: everything on the CPU, a long wait
        telemetry = telemetry_of(steps=1, cpu=64, budget=64, recall_bytes=0, cap=0, backed_off=0, rows=8)
        telemetry.layer(1).cpu_bytes, telemetry.layer(1).cpu_wait_s = 64_000, 2e-3
        stats.add_step(telemetry)
    for _ in range(64):  # now: split, two steps per collection
        telemetry = telemetry_of(steps=2, cpu=24, budget=128, recall_bytes=500, cap=2000, backed_off=0, rows=16)
        layer = telemetry.layer(1)
        layer.cpu_bytes, layer.zero_copy_bytes, layer.zero_copy_blocks, layer.cpu_wait_s = 24_000, 40_000, 40, 1e-5
        layer.zero_copy_s = 3e-5
        stats.add_step(telemetry)
    split = stats.report({})["cpu_split"]
    assert split == {"recent_steps": 128, "cpu_bytes_per_step": 12_000, "zero_copy_bytes_per_step": 20_000,
                     "pcie_bytes_per_step": 20_250, "cpu_wait_ms_per_step": 0.005, "zero_copy_ms_per_step": 0.015}
    assert stats.report({})["cpu_blocks"] == 64 * 64 + 64 * 24
