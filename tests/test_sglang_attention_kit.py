"""SGLang's own attention-backend unit kit (sglang.test.kits.attention_unittest) against `scout`, on the CPU.

The kit builds the backend from a minimal model runner (no model, a one-layer
stock KV pool, a small request pool) and compares extend and decode outputs
with its fp32 reference; its CUDA-graph case drives the decode graph protocol
(init_cuda_graph_state, init_forward_metadata_out_graph at capture and on a
padded replay view) and compares the replayed rows with eager. Contexts are
shorter than the token budget, so scout attends to everything: these cases
check the backend contract, not sparsity. The kit's pool is SGLang's stock
pool, so SCOUT_KV_POOL=stock (the documented setting for it).
"""

from __future__ import annotations

import unittest

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.test.kits.attention_unittest.attention_methods import dense_attention as kit  # noqa: E402
from sglang.test.kits.attention_unittest.runner_modes.cuda_graph_decode_runner import (  # noqa: E402
    run_dense_cuda_graph_decode_case,
)

from scout_sglang.sglang_adapter import plugin  # noqa: E402


@pytest.fixture(autouse=True)
def kit_settings(monkeypatch):
    monkeypatch.setenv("SCOUT_KV_POOL", "stock")
    monkeypatch.setenv("SCOUT_TOKEN_BUDGET", "2048")
    plugin.register()
    with torch.no_grad():
        yield


class _Reporter(unittest.TestCase):
    def runTest(self):  # the kit asserts through a TestCase
        pass


def dense_cases():
    return [case for case in kit.make_dense_cases("scout") if case.sliding_window_size is None]


@pytest.mark.parametrize("case", dense_cases(), ids=lambda case: case.name)
def test_the_kit_dense_cases_pass(case):
    kit.run_dense_attention_case(_Reporter(), case, device="cpu", dtype=torch.bfloat16)


def test_the_kit_decode_graph_protocol_passes():
    case = kit.DenseAttentionCase(name="scout_graph_decode", backend="scout", forward_mode=ForwardMode.DECODE,
                                  num_heads=4, num_kv_heads=2, page_size=1, prefix_lens=(7, 12))
    run_dense_cuda_graph_decode_case(_Reporter(), case, device="cpu", dtype=torch.bfloat16)
