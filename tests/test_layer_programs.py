"""The decode step's per-layer work is a few fused launches with no host step: what keeps a GPU busy.

1. What a GPU executes: the engine's Triton path, run under Triton's interpreter, launches at most 16 kernels
   per offloaded layer and 4 per dense layer (Triton launches, the hand-off's ring and wait among them, plus
   aten ops that are not views),
   in steady steps, steps that complete blocks and steps that recall, at batch 1, 4, 8, 32 and 64 and 1, 2 and
   8 KV heads; it allocates nothing and reads no device value back inside the layer loop; and the host runs at
   most a quarter of the 764.5 Python lines per layer that the unfused step ran (the layers replay their
   recorded launches: launch_program.py), the same at every batch size and head count.
2. The torch path (the CPU device's): ops dispatched and Python lines executed per layer do not depend on the
   batch size or the KV head count (nothing loops over requests or heads; whether a block completes in the
   step changes them: the CPU device copies only completed blocks), and nothing is read back.
3. Each tensor program of a layer (the front's select and split, the device part, the recall, a device-full
   layer) traces with torch.compile(fullgraph=True, dynamic=False): no graph break, no recompile across steady
   steps, steps that complete blocks and steps that recall, and the same outputs as eager.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from support import TRITON_DEVICE, requires_triton

from scout_sglang.config import MODES, ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.host_work import PythonLineCounter
from scout_sglang.core.op_counter import LaunchCounter, OpCounter
from scout_sglang.core.shape import ModelShape

BLOCK, HEAD_DIM, LAYERS = 8, 8, 3
OFFLOADED_BUDGET, DENSE_BUDGET = 16, 4
EXACT_BUDGET = 5  # resident-first's exact path: admit, list, append, decode (a split decode: 2)
UNFUSED_PYTHON_LINES = 764.5  # scout's Python lines per layer before the fused stages (bench_host_overhead)
HANDOFF_KERNELS = 2  # ring and wait: kernels on CUDA, the engine thread's code on the CPU device
ALLOCATING = ("empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like", "new_empty",
              "new_zeros", "new_full", "clone", "randn", "arange", "empty_strided")


def make_engine(mode, batch, num_kv_heads, *, recall_policy="interval", kernel_impl=None, fixed_widths=True,
                length=70, spread=3, device="cpu", estimate=False, cpu_split="off", **settings):
    shape = ModelShape(num_layers=LAYERS, num_qo_heads=2 * num_kv_heads, num_kv_heads=num_kv_heads, head_dim=HEAD_DIM)
    config = ScoutConfig(mode=mode, block_size=BLOCK, token_budget=6 * BLOCK, resident_blocks=3, cpu_groups=1,
                         dense_layers=(0,), recall_policy=recall_policy, recall_interval=2, local_blocks=1,
                         kernel_impl=kernel_impl, estimate=estimate, cpu_split=cpu_split, **settings)
    engine = CoAttentionEngine(config, shape, device=device, dtype=torch.float32, max_requests=batch,
                               max_tokens_per_request=length + 3 * batch + 32, fixed_widths=fixed_widths)
    gen = torch.Generator().manual_seed(0)
    for rid in range(batch):
        engine.add_request(rid)
        n = length + spread * rid  # mixed lengths: blocks complete in different steps
        for layer in range(LAYERS):
            engine.prefill(rid, layer, torch.randn(n, num_kv_heads, HEAD_DIM, generator=gen).to(device),
                           torch.randn(n, num_kv_heads, HEAD_DIM, generator=gen).to(device))
    return engine


def decode_step(engine, gen, *, counters=None):
    """One step with layer-ahead prediction, its inputs and outputs made outside the counted region.
    counters(layer) returns the context managers to run that layer's work under (outermost first): its
    attention, and its front where it runs one layer ahead (during the previous layer).

    Returns the layer outputs, the blocks recalled and whether a token completed a block."""
    shape, batch = engine.shape, len(engine.requests)
    q = torch.randn(LAYERS, batch, shape.num_qo_heads, HEAD_DIM, generator=gen).to(engine.device)
    kv = torch.randn(2, LAYERS, batch, shape.num_kv_heads, HEAD_DIM, generator=gen).to(engine.device)
    outputs = torch.zeros(LAYERS, batch, shape.num_qo_heads, HEAD_DIM, device=engine.device)
    engine.begin_step(sorted(engine.requests))

    def counted(layer):
        stack = contextlib.ExitStack()
        for counter in (counters(layer) if counters else ()):
            stack.enter_context(counter)
        return stack

    with torch.no_grad():
        for layer in range(LAYERS):
            if layer + 1 < LAYERS and engine.wants_prediction(layer + 1):
                with counted(layer + 1):
                    engine.predict(layer + 1, q[layer + 1] + 0.1)
            with counted(layer):
                engine.attend(layer, q[layer], kv[0, layer], kv[1, layer], out=outputs[layer])
    recalled = engine.end_step().totals().recalled_blocks
    completed = any(state.num_tokens % BLOCK == 0 for state in engine.requests.values())
    return outputs, recalled, completed


@requires_triton
@pytest.mark.triton_interpret
@pytest.mark.parametrize("mode", MODES)
def test_a_gpu_runs_a_handful_of_launches_per_layer_allocates_nothing_and_reads_nothing_back(mode, one_torch_thread):
    check_launches(mode, ((1, 1), (4, 2), (8, 8), (32, 1), (64, 8)))


@requires_triton
@pytest.mark.triton_interpret
@pytest.mark.parametrize("mode", ["quest", "infinigen", "scout"])
def test_with_the_estimate_too(mode, one_torch_thread):
    """The estimate adds no launch to scout's layer (it is computed in the CPU part's merge) and one to quest's and
    infinigen's (their one merge): every layer stays within the budget."""
    check_launches(mode, ((4, 2), (64, 8)), estimate=True)


@requires_triton
@pytest.mark.triton_interpret
def test_with_the_estimate_walked_in_slices(monkeypatch, one_torch_thread):
    """Tables longer than SPLIT_BLOCKS: the estimate's partials take one launch more, into the engine's static
    workspace (nothing allocated), and every layer stays within the budget."""
    from scout_sglang.kernels.triton import estimate as triton_estimate

    monkeypatch.setattr(triton_estimate, "SPLIT_BLOCKS", 4)
    check_launches("scout", ((4, 2),), estimate=True, expect="_estimate_partials_kernel")


@requires_triton
@pytest.mark.triton_interpret
def test_with_the_cpu_split_and_the_estimate(one_torch_thread):
    """The CPU split adds one launch to scout's layer: the zero-copy share's decode, one split, no workspace (its
    merge is the CPU part's); with the estimate too every layer stays within the budget."""
    check_launches("scout", ((1, 1),), estimate=True, cpu_split="0.5",
                   expect={"_sparse_decode_split_kernel": 3})  # the device part, the zero-copy share, the fallback


@requires_triton
@pytest.mark.triton_interpret
def test_with_resident_first(one_torch_thread):
    """Resident-first (core/resident_pool.py): each row's k and fill quota are plan data, the resident columns a
    device table gathered once per step; no launch more per layer, nothing allocated or read back, the same Python
    lines at every batch. At batch 1 the request is exact, then outgrows its pool of 3 pages; at 4 (12 pages) one
    row is exact and three are sparse (the batch-1 request's exact steps take the exact path: the next test)."""
    check_launches("scout", ((1, 1), (4, 2)), resident_first=True, exact_path=None)


@requires_triton
@pytest.mark.triton_interpret
def test_resident_first_exact_path_launches_what_a_dense_layer_does_and_one_more_pair(one_torch_thread):
    """Resident-first with a pool that holds every block: after the first step (which fills the rows) every step
    runs the exact path (core/layer_stages.attend_exact): an offloaded layer admits the block leaving the window,
    lists its pages, appends and decodes; no score, selection, hand-off, merge or recall. At most EXACT_BUDGET
    launches, the same at batch 1 and 4, nothing allocated or read back."""
    check_launches("scout", ((1, 1), (4, 2)), resident_first=True, resident_pool_blocks=64,
                   offloaded_budget=EXACT_BUDGET, exact_path=True,
                   expect={"_resident_row_kernel": 1, "_split_lists_kernel": 1, "_append_token_kernel": 1})


def check_launches(mode, shapes, estimate=False, expect=None, cpu_split="off", offloaded_budget=OFFLOADED_BUDGET,
                   exact_path=False, **settings):
    """expect: a Triton kernel every offloaded layer launches, or {kernel: how many times}; exact_path: whether
    every counted step runs resident-first's exact path (None: either)"""
    python = {}
    for batch, num_kv_heads in shapes:
        # larger: counted, not run (see LaunchCounter): the interpreter is slow (a GPU runs them all)
        run = batch * num_kv_heads <= 8 or TRITON_DEVICE == "cuda"
        engine = make_engine(mode, batch, num_kv_heads, kernel_impl="triton", length=45,  # 48: a block completes
                             device=TRITON_DEVICE, estimate=estimate, cpu_split=cpu_split, **settings)
        counters = {}

        def per_layer(layer):
            counters.setdefault(layer, LaunchCounter(run=run))
            return (counters[layer],)

        try:
            gen = torch.Generator().manual_seed(1)
            with LaunchCounter(run=run):
                decode_step(engine, gen)  # first fills
            completed = recalled = 0
            for step in range(2 if run else 1):  # block fills and interval recalls among them
                counters.clear()
                assert exact_path is None or engine.exact_step_ready(sorted(engine.requests)) == exact_path
                _, moved, filled = decode_step(engine, gen, counters=per_layer)
                completed, recalled = completed + filled, recalled + moved
                lines = PythonLineCounter(skip_launches=True, run_launches=run)
                _, moved, filled = decode_step(engine, gen, counters=lambda layer, c=lines: (c,))
                python[(batch, num_kv_heads)] = lines.lines / LAYERS
                completed, recalled = completed + filled, recalled + moved
                for layer, counter in counters.items():
                    launches = counter.launches()
                    dense = layer in engine.full_layers and layer not in engine._selects  # no selection
                    budget = DENSE_BUDGET if dense else offloaded_budget
                    where = f"{mode} batch {batch} Hkv {num_kv_heads} layer {layer}: {dict(counter.triton)} {counter.ops}"
                    assert launches <= budget, where
                    assert counter.reads == 0, where
                    allocating = {op: n for op, n in counter.ops.items() if op.split(".")[1] in ALLOCATING}
                    assert not allocating, where
                    assert sum(counter.triton.values()) >= 2, where  # it did run the Triton path
                    if isinstance(expect, dict) and not dense:
                        assert all(counter.triton.get(kernel) == n for kernel, n in expect.items()), where
                    else:
                        assert expect is None or dense or counter.triton.get(expect), where
            if run:
                assert completed, "no step completed a block"
                if mode == "scout" and batch == 4 and not exact_path:
                    assert recalled, "no step recalled a block"
        finally:
            engine.close()
    assert len(set(python.values())) == 1, f"{mode}: Python lines per layer {python}"
    assert max(python.values()) <= UNFUSED_PYTHON_LINES / 4, f"{mode}: Python lines per layer {python}"


@pytest.mark.parametrize("mode, estimate", [(mode, False) for mode in MODES] + [("quest", True), ("scout", True)])
def test_the_torch_path_is_flat_in_batch_and_heads_and_reads_nothing_back(mode, estimate, one_torch_thread):
    counts, lines = {}, {}
    for batch, num_kv_heads in ((1, 1), (5, 1), (5, 4)):
        # Equal lengths: the CPU device copies only the blocks a step completes (host-side list), so the ops of
        # a step depend on whether a block completes in it, the same at every batch here.
        engine = make_engine(mode, batch, num_kv_heads, spread=0, estimate=estimate)
        try:
            gen = torch.Generator().manual_seed(1)
            decode_step(engine, gen)  # first fills
            steps = []
            for _ in range(4):  # steady steps, block fills and recalls among them
                counter = OpCounter()
                decode_step(engine, gen, counters=lambda layer, c=counter: (c,))
                steps.append(counter)
            python = []
            for _ in range(4):  # counted apart: the op counter's own Python runs for views too
                python.append(PythonLineCounter())
                decode_step(engine, gen, counters=lambda layer, c=python[-1]: (c,))
        finally:
            engine.close()
        for counter in steps:
            assert counter.reads == 0, f"{mode}: a device value read back inside the layer loop"
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


PROGRAMS = ("select_split", "device_part", "recall", "attend_full")


@pytest.mark.parametrize("mode, estimate", [(mode, False) for mode in MODES] + [("quest", True)])
def test_every_layer_program_compiles_whole_once_and_matches_eager(mode, estimate, one_torch_thread):
    torch._dynamo.reset()
    eager, compiled = make_engine(mode, 3, 2, estimate=estimate), make_engine(mode, 3, 2, estimate=estimate)
    backend = CompileCounter()
    for name in PROGRAMS:
        setattr(compiled.stages, name, torch.compile(getattr(compiled.stages, name), fullgraph=True, dynamic=False,
                                                     backend=backend))
    try:
        gen_eager, gen_compiled = torch.Generator().manual_seed(2), torch.Generator().manual_seed(2)
        completed = recalled = 0
        for step in range(7):  # blocks complete and interval recalls fire in these steps
            expected, _, _ = decode_step(eager, gen_eager)
            outputs, moved, filled = decode_step(compiled, gen_compiled)
            torch.testing.assert_close(outputs, expected, rtol=0, atol=0)
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
