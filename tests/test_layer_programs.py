"""The decode step's per-layer work is a fixed program: what a GPU server needs to keep its stream busy.

1. Ops dispatched and Python lines executed per layer do not depend on the batch size or the KV head count
   (nothing loops over requests or heads), and no device value is read back inside the layer loop (every
   scalar read would be a stream sync on a GPU).
2. Each per-layer program traces with torch.compile(fullgraph=True, dynamic=False): no graph break, no
   recompile across steady steps, a step that completes blocks and a step that recalls, and the same
   outputs as eager. The CPU hand-off and the recall copies run between the programs, where a breakable
   CUDA graph breaks.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from scout_sglang.config import MODES, ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.host_work import PythonLineCounter
from scout_sglang.core.op_counter import OpCounter
from scout_sglang.core.shape import ModelShape

BLOCK, HEAD_DIM, LAYERS = 8, 8, 3
PROGRAMS = ("_run_full", "_run_front", "_run_device_part", "_run_merge", "_run_recall")


def make_engine(mode, batch, num_kv_heads, *, recall_policy="interval", fixed_widths=True):
    shape = ModelShape(num_layers=LAYERS, num_qo_heads=2 * num_kv_heads, num_kv_heads=num_kv_heads, head_dim=HEAD_DIM)
    config = ScoutConfig(mode=mode, block_size=BLOCK, token_budget=6 * BLOCK, resident_blocks=3, cpu_groups=1,
                         dense_layers=(0,), recall_policy=recall_policy, recall_interval=2, local_blocks=1)
    engine = CoAttentionEngine(config, shape, dtype=torch.float32, max_requests=batch, max_tokens_per_request=256,
                               fixed_widths=fixed_widths)
    gen = torch.Generator().manual_seed(0)
    for rid in range(batch):
        engine.add_request(rid)
        length = 70 + 3 * rid  # mixed lengths: blocks complete in different steps
        for layer in range(LAYERS):
            engine.prefill(rid, layer, torch.randn(length, num_kv_heads, HEAD_DIM, generator=gen),
                           torch.randn(length, num_kv_heads, HEAD_DIM, generator=gen))
    return engine


def decode_step(engine, gen, *counters):
    """One step with layer-ahead prediction; the layer loop runs under `counters` (outermost first).

    Returns the layer outputs, the blocks recalled and whether a token completed a block."""
    shape, batch = engine.shape, len(engine.requests)
    q = torch.randn(LAYERS, batch, shape.num_qo_heads, HEAD_DIM, generator=gen)
    kv = torch.randn(2, LAYERS, batch, shape.num_kv_heads, HEAD_DIM, generator=gen)
    engine.begin_step(sorted(engine.requests))
    outputs = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        for counter in counters:
            stack.enter_context(counter)
        for layer in range(LAYERS):
            if layer + 1 < LAYERS and engine.wants_prediction(layer + 1):
                engine.predict(layer + 1, q[layer + 1] + 0.1)
            outputs.append(engine.attend(layer, q[layer], kv[0, layer], kv[1, layer]))
    recalled = engine.end_step().totals().recalled_blocks
    completed = any(state.num_tokens % BLOCK == 0 for state in engine.requests.values())
    return outputs, recalled, completed


@pytest.mark.parametrize("mode", MODES)
def test_ops_and_python_per_layer_do_not_grow_with_the_batch_or_the_heads_and_nothing_is_read_back(
        mode, one_torch_thread):
    counts, lines = {}, {}
    for batch, num_kv_heads in ((1, 1), (5, 1), (5, 4)):
        engine = make_engine(mode, batch, num_kv_heads)
        try:
            gen = torch.Generator().manual_seed(1)
            decode_step(engine, gen)  # first fills
            steps = []
            for _ in range(4):  # steady steps, block fills and recalls among them
                counter = OpCounter()
                decode_step(engine, gen, counter)
                steps.append(counter)
            python = []
            for _ in range(4):  # counted apart: the op counter's own Python runs for views too
                python.append(PythonLineCounter())
                decode_step(engine, gen, python[-1])
        finally:
            engine.close()
        for counter in steps:
            assert counter.scalar_reads == 0, f"{mode}: a device value read back inside the layer loop"
        counts[(batch, num_kv_heads)] = [counter.launches() for counter in steps]
        lines[(batch, num_kv_heads)] = [counter.lines for counter in python]
    assert counts[(1, 1)] == counts[(5, 1)] == counts[(5, 4)], f"{mode}: ops per step {counts}"
    assert lines[(1, 1)] == lines[(5, 1)] == lines[(5, 4)], f"{mode}: Python lines per step {lines}"


class CompileCounter:
    """A torch.compile backend that runs the traced graph eagerly and counts compilations."""

    def __init__(self):
        self.compiles = 0

    def __call__(self, graph_module, example_inputs):
        self.compiles += 1
        return graph_module.forward


@pytest.mark.parametrize("mode", MODES)
def test_every_layer_program_compiles_whole_once_and_matches_eager(mode, one_torch_thread):
    torch._dynamo.reset()
    eager, compiled = make_engine(mode, 3, 2), make_engine(mode, 3, 2)
    backend = CompileCounter()
    for name in PROGRAMS:
        setattr(compiled, name, torch.compile(getattr(compiled, name), fullgraph=True, dynamic=False, backend=backend))
    try:
        gen_eager, gen_compiled = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
        completed = recalled = 0
        for step in range(7):  # blocks complete and interval recalls fire in these steps
            expected, _, _ = decode_step(eager, gen_eager)
            outputs, moved, filled = decode_step(compiled, gen_compiled)
            for a, b in zip(expected, outputs):
                torch.testing.assert_close(b, a, rtol=0, atol=0)
            if step == 0:
                after_first_step = backend.compiles
                assert after_first_step > 0
            else:
                completed, recalled = completed + filled, recalled + moved
        assert backend.compiles == after_first_step, f"{mode}: recompiled after the first step"
        assert completed > 0, "no step completed a block"
        if mode in ("scout", "infinigen"):
            assert recalled > 0, "no step recalled a block"
    finally:
        eager.close()
        compiled.close()
