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
