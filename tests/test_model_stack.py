"""The GPU benchmark's model stack and workload (benchmarks/model_stack/): the layer-ahead prediction is the next
layer's real query when the layer adds nothing to the residual; a step makes no tensor of its own (every op
writes a buffer allocated once: what one CUDA graph captures); the heavy-hitter workload's calibration (change
rate per step, predicted-query cosine) against what it is set to and what the paper measured; the planner's
batches for the headline's box; and, on a GPU, the whole step captured in one graph replaying an eager step."""

import sys
from pathlib import Path

import pytest
import torch
from support import TRITON_DEVICE, requires_cuda
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from model_stack.qwen3 import TINY, Qwen3Stack  # noqa: E402
from model_stack.workload import DeviceWorkload  # noqa: E402

from scout_sglang.config import ScoutConfig  # noqa: E402
from scout_sglang.core.engine import CoAttentionEngine  # noqa: E402
from scout_sglang.core.op_counter import is_view  # noqa: E402
from scout_sglang.core.shape import ModelShape  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class RecordingEngine:
    """What the stack calls of an engine: every layer past the first predicted, queries and predictions recorded,
    attention out = 0 (the residual then changes only by the MLP)."""

    def __init__(self):
        self.predicted, self.real = {}, {}

    def wants_prediction(self, layer):
        return layer >= 1

    def predict(self, layer, q_pred):
        self.predicted[layer] = q_pred.clone()

    def attend(self, layer, q, k, v, *, out):
        self.real[layer] = q.clone()
        out.zero_()


def make_stack(batch=3):
    stack = Qwen3Stack(TINY, max_batch=batch, max_position=64, device="cpu", dtype=torch.float32, seed=1)
    stack.hidden.normal_(generator=torch.Generator().manual_seed(2))
    stack.set_positions(torch.tensor([5, 17, 40][:batch]))
    return stack


def test_the_layer_ahead_prediction_is_the_next_layers_query_when_the_residual_does_not_move():
    """Layer i's prediction is layer i+1's q projection, q_norm and RoPE applied to layer i's normalized input (the
    server's): with no update to the residual (zero MLP output, zero attention) and the same input norm in every
    layer, it equals layer i+1's own query exactly; with the MLP on, it differs."""
    stack = make_stack()
    for weights in stack.layers:
        weights["down"].zero_()
        weights["input_norm"].copy_(stack.layers[0]["input_norm"])
    engine = RecordingEngine()
    stack.step(engine, 3)
    assert set(engine.predicted) == set(range(1, TINY.num_layers))
    for layer, predicted in engine.predicted.items():
        assert torch.equal(predicted, engine.real[layer]), layer
    moving = make_stack()  # the MLP moves the residual: the prediction is only close
    engine = RecordingEngine()
    moving.step(engine, 3)
    assert not torch.equal(engine.predicted[1], engine.real[1])
    cosine = torch.nn.functional.cosine_similarity(engine.predicted[1].flatten(), engine.real[1].flatten(), dim=0)
    assert 0.2 < float(cosine) < 1.0


class NewTensors(TorchDispatchMode):
    """Ops that return a tensor none of their arguments is (nor views it): an allocation in a captured graph."""

    def __init__(self):
        super().__init__()
        self.allocating = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in (*args, *(kwargs or {}).values()) if isinstance(t, torch.Tensor)}
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        for tensor in outputs:
            if isinstance(tensor, torch.Tensor) and not is_view(str(func)) and \
                    tensor.untyped_storage().data_ptr() not in inputs:
                self.allocating.append(str(func))
        return out


def test_a_step_of_the_stack_writes_only_buffers_it_allocated_once():
    """Every op of a step (norms, projections, RoPE, MLP, the workload's injection) writes into a buffer of the
    stack's or of the engine's: no op makes a tensor of its own, so the step replays from a CUDA graph at the same
    addresses (the engine's own step is checked by test_step_capture.py and test_layer_programs.py)."""
    stack = make_stack()
    workload = DeviceWorkload("heavy", num_layers=TINY.num_layers, num_qo_heads=TINY.num_qo_heads,
                              num_kv_heads=TINY.num_kv_heads, head_dim=TINY.head_dim, block_size=8, batch=3,
                              context=40, max_new=4, device="cpu")
    for row in range(3):
        for layer in range(TINY.num_layers):
            workload.prompt(row, layer)
    workload.next_step()
    engine = RecordingEngine()
    with NewTensors() as trace:
        stack.step(engine, 3, inject=workload.inject)
    assert [op for op in trace.allocating if not op.startswith("aten.clone")] == []  # the recorder's own clones
    assert torch.equal(engine.real[2], workload.q[2].to(torch.float32))  # the workload's query reached the engine
    assert torch.equal(engine.predicted[2], workload.q_pred[2])


def change_and_cosine(kind: str, *, context: int = 4096, steps: int = 30) -> tuple[float, float]:
    """The selection's change rate per step (quest: the real query's top-k, no prediction) and the predicted-query
    cosine of the workload at a block of 32 and a 512-token budget."""
    layers, heads, kv, dim, block = 2, 8, 2, 128, 32
    workload = DeviceWorkload(kind, num_layers=layers, num_qo_heads=heads, num_kv_heads=kv, head_dim=dim,
                              block_size=block, batch=2, context=context, max_new=steps + 1, device="cpu")
    engine = CoAttentionEngine(ScoutConfig(mode="quest", block_size=block, token_budget=512),
                               ModelShape(num_layers=layers, num_qo_heads=heads, num_kv_heads=kv, head_dim=dim),
                               dtype=torch.float32, max_requests=2, max_tokens_per_request=context + steps + 64,
                               cpu_worker=False, track_changes=True)
    for row in range(2):
        engine.add_request(row)
        for layer in range(layers):
            engine.prefill(row, layer, *workload.prompt(row, layer))
    rates = []
    for step in range(steps):
        workload.next_step()
        engine.begin_step([0, 1])
        for layer in range(layers):
            engine.attend(layer, workload.q[layer], workload.k_new[layer], workload.v_new[layer])
        telemetry = engine.end_step()
        if step >= 5:  # past the first selections
            rates.append(telemetry.totals().change_rate)
    engine.close()
    return sum(rates) / len(rates), workload.predict_cosine()


def test_the_heavy_hitter_workload_is_calibrated_as_it_says_and_the_flat_one_churns():
    """Heavy hitters (the default): about a tenth of the selection changes per step (the paper measured under 15%
    on real models) and the prediction's cosine is its target 0.95; the flat stress case churns far more."""
    heavy_rate, heavy_cosine = change_and_cosine("heavy")
    flat_rate, _ = change_and_cosine("flat")
    assert 0.04 <= heavy_rate <= 0.15, heavy_rate
    assert abs(heavy_cosine - 0.95) < 0.01, heavy_cosine
    assert flat_rate > 2 * heavy_rate, (flat_rate, heavy_rate)


def test_the_headline_batches_for_a_fixed_box():
    """The headline's default budgets (full attention at 2 requests of 64k + 1024 tokens on the device: 18.3 GiB;
    80% of the host's free memory for scout) on a 128 GiB host with 110 GiB free: the host holds over 4x the
    device budget; full takes 2 requests, device-bound; scout takes 9, host-bound: each holds 35 offloaded
    layers x 66560 tokens x 4 KiB = 8.9 GiB of K/V in the host (88 GiB budget), and 0.9 GiB on the device."""
    from model_stack.headline import headline_budgets, planned_batch

    budgets = headline_budgets(context=65536, host_free_bytes=110 * 2**30)
    assert budgets["host_budget_bytes"] >= 4 * budgets["device_budget_bytes"]
    full, scout = (planned_batch(mode, budgets, context=65536) for mode in ("full", "scout"))
    assert (full.max_batch, full.limit) == (2, "device memory")
    assert (scout.max_batch, scout.limit) == (9, "host memory")


def test_a_split_row_gives_the_shares_and_the_zero_copy_reads_time_and_rate():
    """The CPU device, every listed block to the device (share 0): the row says so, with the zero-copy reads' own
    time (timed by the engine's thread here, by the kernel's clock on CUDA) and the rate from it."""
    from model_stack.run import StackRun

    run = StackRun(TINY, mode="scout", batch=2, context=96, steps=4, workload="heavy", block_size=8, token_budget=32,
                   device="cpu", cpu_split="0")
    try:
        split = run.measure(3, overlapped=False)["split"]
    finally:
        run.close()
    assert split["zero_copy_share"] == 1.0 and split["cpu_mb_per_step"] == 0.0 and split["caps"] == [0, 0]
    assert split["zero_copy_ms_per_step"] > 0 and split["zero_copy_gbs"] is not None
    assert split["source"] == "fixed share" and split["link"].startswith("configured")


@requires_cuda
@pytest.mark.parametrize("mode", ["full", "scout"])
def test_on_a_gpu_the_whole_step_replays_from_one_cuda_graph_like_an_eager_step(mode):
    from model_stack.run import StackRun

    runs = [StackRun(TINY, mode=mode, batch=2, context=96, steps=6, workload="heavy", block_size=8,
                     token_budget=32, device="cuda") for _ in range(2)]
    try:
        assert runs[1].capture()
        for _ in range(3):
            outputs = []
            for run in runs:
                run.step()
                outputs.append(run.stack.output[:2].float().clone())
            torch.testing.assert_close(outputs[1], outputs[0], atol=2e-2, rtol=2e-2)
    finally:
        for run in runs:
            run.close()


@pytest.mark.parametrize("fields", [{}, {"resident_first": True}], ids=["selecting", "resident-first"])
def test_overlapped_steps_read_nothing_from_the_device_and_advance_every_request(fields):
    """measure() also times steps back to back as SGLang's overlap scheduler runs them: the loop (inputs, plan,
    layers, commit) must not read a device value, or on a GPU each step would wait for the one before (a CPU proxy:
    no scalar read on this thread); each of its steps decodes a token of every request."""
    from model_stack.parts import stack_steps
    from model_stack.run import StackRun

    from scout_sglang.core.op_counter import OpCounter

    context, steps = 96, 2
    run = StackRun(TINY, mode="scout", batch=2, context=context, steps=stack_steps(steps), workload="heavy",
                   block_size=8, token_budget=32, device="cpu", **fields)
    try:
        row = run.measure(steps)
        assert row["overlapped_step_ms"] > 0 and row["overlapped_tokens_per_s"] > 0
        assert [state.num_tokens for state in run.engine.requests.values()] == [context + 1 + 2 * steps] * 2
        with OpCounter() as counter:
            run.steps_overlapped(steps)
        assert counter.scalar_reads == 0, {op: n for op, n in counter.ops.items() if "scalar" in op}
    finally:
        run.close()


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_the_decode_kernel_comparison_reads_the_whole_context_and_agrees_with_sdpa(impl):
    """The resident part's kernel comparison: the engine's decode over a page table of every block of each request
    against torch's SDPA over the same K/V laid out contiguously. Their outputs agree only if the table lists every
    page of the right request in order (on a GPU the same check runs at 32k and 64k); the rates are per K/V byte."""
    from model_stack.decode_kernels import one_shape

    context = 256  # 32 blocks: up to 4 splits of whole tiles (64 tokens)
    row = one_shape(TRITON_DEVICE, batch=2, context=context, num_qo_heads=4, num_kv_heads=2, head_dim=16,
                    block_size=8, impl=impl, dtype=torch.float32)
    assert row["max_abs_diff"] < 1e-4 and row["sdpa_max_abs_diff"] < 1e-4 and row["agrees"], row
    if impl == "triton":  # the split sweep: every split count it ran gives the same output
        assert row["default_splits"] in row["engine_ms_by_splits"] and len(row["engine_ms_by_splits"]) >= 2, row
        assert row["sweep_max_abs_diff"] < 1e-4, row
    kv_bytes = 2 * 2 * 2 * context * 16 * 4
    assert row["engine_gbs"] == pytest.approx(kv_bytes / row["engine_ms"] / 1e6)
    assert row["sdpa_gbs"] == pytest.approx(kv_bytes / row["sdpa_ms"] / 1e6)
    assert row["engine_over_sdpa"] == pytest.approx(row["sdpa_ms"] / row["engine_ms"])
    with pytest.raises(ValueError, match="multiple of the block size"):
        one_shape(TRITON_DEVICE, batch=1, context=60, num_qo_heads=4, num_kv_heads=2, head_dim=16, block_size=8, impl=impl)


def test_the_past_exact_row_runs_every_request_sparse_with_a_row_that_holds_most_of_it():
    """The resident part's last row per context: at the largest batch full attention was measured at, a pool one
    request short of holding them all. Every request must be sparse (else the row measures the exact path again)
    and each keeps its share of the pool; its ratio to full attention is keyed apart from the exact row's."""
    import time
    from types import SimpleNamespace

    from model_stack.low_load import PAST_EXACT, past_exact_rows, ratios
    from model_stack.parts import stack_shape

    setup = SimpleNamespace(dry=True, device=torch.device("cpu"), block=8, budget=32, steps=2)
    full = dict(mode="full", batch=2, context=64, step_ms=1.0, tokens_per_s=2000.0)
    exact = dict(mode="scout", batch=2, context=64, step_ms=1.0, tokens_per_s=1000.0)
    rows = past_exact_rows(setup, stack_shape(setup), 64, [full, exact], time.perf_counter() + 300)
    assert len(rows) == 1 and "error" not in rows[0], rows
    row = rows[0]
    assert row["variant"] == PAST_EXACT and row["resident"]["requests"] == 2
    assert row["resident"]["exact_share"] == 0.0 and row["resident"]["exact_path_steps"] == 0, row["resident"]
    assert row["resident"]["used"] == row["pool"]["pages"]  # every page in use: each request at its share
    keyed = ratios([full, exact, row])
    assert keyed["64x2"] == 0.5 and keyed[f"64x2+{PAST_EXACT}"] == round(row["tokens_per_s"] / 2000.0, 3)
    assert past_exact_rows(setup, stack_shape(setup), 64, [], time.perf_counter() + 300) == []
