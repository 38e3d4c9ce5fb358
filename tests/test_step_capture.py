"""A whole decode step captured once and replayed for every later step: what one CUDA graph per batch size does.

The CPU proxy of a captured graph: the engine's Triton path runs under Triton's interpreter, and a step's
every launch, over every layer, the layer-ahead fronts and the CPU part's ring and wait included, is recorded
once (launch_program.Recorder: what a capture records) over static input and output buffers, with a plan of
padding rows only (as SGLang captures with a dummy batch); on a GPU the same test captures a real CUDA graph.
Each later step writes its plan into the static plan buffer (begin_step, outside the graph) and its inputs into
the static buffers, then replays the recorded launches, and nothing else: the outputs equal an eager engine's,
and so do the step's counters. That holds only if the step allocates nothing, reads nothing back, branches on no
data on the host and writes every per-step value into static buffers.
"""

import pytest
import torch
from support import TRITON_DEVICE, requires_triton

from scout_sglang.config import MODES, ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.launch_program import Recorder
from scout_sglang.core.shape import ModelShape

pytestmark = [requires_triton, pytest.mark.triton_interpret, pytest.mark.usefixtures("one_torch_thread")]
SHAPE = ModelShape(num_layers=3, num_qo_heads=4, num_kv_heads=2, head_dim=16)
LENGTHS = (20, 41, 7)
CAPTURED_ROWS = 4  # the graph's batch size: one row more than the requests, a padding row


def make_engine(mode, estimate=False, cpu_split="off", lengths=LENGTHS, **settings):
    config = ScoutConfig(mode=mode, block_size=8, token_budget=32, sink_blocks=1, local_blocks=1, cpu_groups=1,
                         resident_blocks=2, recall_policy="interval", recall_interval=2, kernel_impl="triton",
                         estimate=estimate, cpu_split=cpu_split, **settings)
    engine = CoAttentionEngine(config, SHAPE, device=TRITON_DEVICE, dtype=torch.float32, max_requests=CAPTURED_ROWS,
                               max_tokens_per_request=128, fixed_widths=True)
    gen = torch.Generator().manual_seed(0)
    for rid, n in enumerate(lengths):
        engine.add_request(rid)
        for layer in range(SHAPE.num_layers):
            k, v = (torch.randn(n, 2, 16, generator=gen).to(TRITON_DEVICE) for _ in range(2))
            engine.prefill(rid, layer, k, v)
    return engine


def capture(engine, *buffers):
    """Capture one step over the static buffers (a plan of padding rows only) -> the function that replays it: a
    CUDA graph on a GPU; on the CPU the recorded Triton launches, run again and nothing else."""
    engine.begin_step([], rows=CAPTURED_ROWS)
    if TRITON_DEVICE == "cuda":
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(stream):
            layer_loop(engine, *buffers)  # warm-up: Triton compiles and the layer programs record
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            layer_loop(engine, *buffers)
        engine.end_step(read=False)
        return graph.replay
    with torch.no_grad(), Recorder() as recorder:
        layer_loop(engine, *buffers)
    engine.end_step(read=False)
    assert len(recorder.launches) >= 2 * SHAPE.num_layers

    def replay():
        for kernel, grid, args, kwargs in recorder.launches:
            kernel.run(*args, grid=grid, warmup=False, **kwargs)
    return replay


def layer_loop(engine, q, q_pred, k, v, out):
    for layer in range(SHAPE.num_layers):
        if layer + 1 < SHAPE.num_layers and engine.wants_prediction(layer + 1):
            engine.predict(layer + 1, q_pred[layer + 1])
        engine.attend(layer, q[layer], k[layer], v[layer], out=out[layer])


@pytest.mark.parametrize("mode", MODES)
def test_a_step_recorded_once_replays_every_later_step_like_an_eager_engine(mode):
    replays_like_eager(mode)


@pytest.mark.parametrize("mode", ["quest", "infinigen", "scout"])
def test_with_the_estimate_too(mode):
    """The estimate's kernel reads the step's plan and selection from static buffers: a replayed step estimates
    what an eager one does (the padding row, with no full block, estimates nothing)."""
    replays_like_eager(mode, estimate=True)


def test_with_the_cpu_split_too():
    """The split's caps are plan data and its zero-copy share's lists and results static buffers: a replayed step
    splits and merges what an eager one does, at a cap that changes every step (0, 1, 2 blocks to the workers;
    short lists here), so a cap baked into the graph would show (on a GPU the side stream is captured too)."""
    replays_like_eager("scout", cpu_split="0.0")


def test_with_resident_first_too():
    """Resident-first (core/resident_pool.py): each row's k, fill quota and resident pages are plan data and a
    device table, so one replayed step serves the exact rows (every block selected, no CPU part) and the sparse one
    (whose quota of 4 resident pages is below its 6-7 blocks) as an eager step does."""
    replays_like_eager("scout", lengths=(20, 70, 7), resident_first=True)


def replays_like_eager(mode, estimate=False, cpu_split="off", lengths=LENGTHS, **settings):
    eager, graph = (make_engine(mode, estimate, cpu_split, lengths, **settings) for _ in range(2))
    shape = (SHAPE.num_layers, CAPTURED_ROWS)
    q, q_pred, out = (torch.zeros(*shape, 4, 16, device=TRITON_DEVICE) for _ in range(3))  # the static buffers
    k, v = (torch.zeros(*shape, 2, 16, device=TRITON_DEVICE) for _ in range(2))
    replay = capture(graph, q, q_pred, k, v, out)
    gen = torch.Generator().manual_seed(3)
    rows, eager_totals = len(lengths), []
    try:
        for step in range(6):  # first fills, block fills and interval recalls among these steps
            inputs = [torch.randn(SHAPE.num_layers, rows, *t.shape[2:], generator=gen).to(TRITON_DEVICE)
                      for t in (q, q_pred, k, v)]
            for engine in (eager, graph):
                if engine.cpu_split is not None:
                    engine.cpu_split.caps = dict.fromkeys(engine.cpu_split.caps, step % 3)
            eager.begin_step(list(range(rows)))
            expected = torch.zeros(SHAPE.num_layers, rows, 4, 16, device=TRITON_DEVICE)
            with torch.no_grad():
                layer_loop(eager, inputs[0], inputs[1], inputs[2], inputs[3], expected)
            eager_totals.append(eager.end_step().totals())
            for static, live in zip((q, q_pred, k, v), inputs):
                static[:, :rows] = live
            graph.begin_step(list(range(rows)), rows=CAPTURED_ROWS)  # the plan: outside the graph
            replay()
            graph.end_step(read=False)
            torch.testing.assert_close(out[:, :rows], expected, atol=2e-5, rtol=2e-5, msg=lambda m: f"step {step}: {m}")
            if graph.pool is not None:  # both exact and sparse rows in every step
                assert [graph.pool.exact[rid] for rid in range(rows)] == [True, False, True]
            assert torch.count_nonzero(out[:, rows:]) == 0, "the padding row attends nothing"
        replayed = graph.collect_telemetry().totals()
        for name in ("selected_blocks", "cpu_blocks", "recalled_blocks", "changed_blocks", "budget_blocks",
                     "zero_copy_blocks"):
            assert getattr(replayed, name) == sum(getattr(t, name) for t in eager_totals), name
        if mode == "scout":
            assert replayed.cpu_blocks > 0 and replayed.recalled_blocks > 0
            assert cpu_split == "off" or replayed.zero_copy_blocks > 0
    finally:
        eager.close()
        graph.close()
