"""CoAttentionEngine on random KV: every mode against dense attention and the
cross-mode identities, recall, and request lifecycle. Each decision against an
independent oracle: test_engine_oracle.py."""

import re

import pytest
import torch
from oracle.driver import Driver
from support import requires_cuda

from scout_sglang.config import MODES, ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape
from scout_sglang.cpu_worker.flag_worker import FlagWorker

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHAPE = ModelShape(num_layers=3, num_qo_heads=8, num_kv_heads=2, head_dim=32)
BLOCK = 8


def make_engine(mode, *, budget, **overrides):
    settings = dict(mode=mode, block_size=BLOCK, token_budget=budget, sink_blocks=1, local_blocks=2, cpu_groups=1)
    config = ScoutConfig(**(settings | overrides))
    return CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=512)


def run(driver, engine):
    """Outputs and per-step telemetry of an engine fed by a driver."""
    outputs = driver.run(engine)
    return outputs, driver.telemetry


def make_driver(lengths, steps, seed=0, predict_noise=0.3):
    """predict_noise: how far the predicted query is from the real one (0: layer-ahead is exact)."""
    return Driver(SHAPE, lengths, steps, seed=seed, predict_noise=predict_noise)


@pytest.mark.parametrize("estimate", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_budget_covering_the_context_equals_dense_attention(mode, estimate):
    driver = make_driver([5, 30, 70], steps=20)
    outputs, _ = run(driver, make_engine(mode, budget=128, estimate=estimate))
    torch.testing.assert_close(outputs, driver.dense(), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("mode", ["scout", "hgca"])
def test_a_covering_budget_with_a_small_device_share_splits_the_work_and_still_equals_dense(mode):
    """Device part + CPU part merged == dense: a resident buffer of one block leaves most blocks to the CPU.
    The CPU part runs with the query it was given, so scout's prediction is exact here."""
    driver = make_driver([5, 30, 70], steps=20, predict_noise=0.0)
    outputs, telemetry = run(driver, make_engine(mode, budget=128, resident_blocks=1, dense_layers=()))
    torch.testing.assert_close(outputs, driver.dense(), atol=2e-5, rtol=2e-5)
    assert sum(t.totals().cpu_blocks for t in telemetry) > 20 * SHAPE.num_layers  # the CPU did much of the work


@pytest.mark.parametrize("estimate", [False, True])
def test_with_a_sparse_budget_every_offloading_mode_attends_exactly_the_quest_selection(estimate):
    """Same selection (predicted == real query): quest, hgca, infinigen and scout without a resident
    buffer cover the same blocks, scout's through the CPU part, and estimate the same others."""
    driver = make_driver([150, 90], steps=12, seed=1, predict_noise=0.0)
    quest, _ = run(driver, make_engine("quest", budget=48, estimate=estimate))
    hgca, _ = run(driver, make_engine("hgca", budget=48, estimate=estimate))
    infinigen, _ = run(driver, make_engine("infinigen", budget=48, estimate=estimate))
    # all but the window on the CPU
    scout, _ = run(driver, make_engine("scout", budget=48, resident_blocks=0, estimate=estimate))
    torch.testing.assert_close(hgca, quest, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(infinigen, quest, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(scout, quest, atol=2e-5, rtol=2e-5)
    assert (quest - driver.dense()).abs().max() > 1e-3  # the budget really is sparse


@pytest.mark.parametrize("mode", ["quest", "infinigen", "hgca", "scout"])
def test_with_keys_equal_within_each_block_the_estimate_makes_a_sparse_budget_dense(mode):
    """The estimate's second identity, through the engine: a block whose keys are all equal is estimated exactly,
    so the attended part and the estimate of the rest add up to dense attention (scout's prediction exact here,
    so that its CPU part uses the real query too)."""
    driver = make_driver([150, 90], steps=12, seed=2, predict_noise=0.0)
    gen = torch.Generator().manual_seed(2)
    for (b, l), (k, _) in driver.prompts.items():
        keys = 2 * torch.randn(64, SHAPE.num_kv_heads, SHAPE.head_dim, generator=gen)  # one key per block
        total = driver.lengths[b] + driver.steps
        per_token = keys.repeat_interleave(BLOCK, dim=0)[:total]
        k.copy_(per_token[: driver.lengths[b]])
        driver.new_k[:, l, b] = per_token[driver.lengths[b]:]
    outputs, _ = run(driver, make_engine(mode, budget=48, estimate=True))
    torch.testing.assert_close(outputs, driver.dense(), atol=2e-5, rtol=2e-5)
    without, _ = run(driver, make_engine(mode, budget=48))
    assert (without - driver.dense()).abs().max() > 1e-3  # the budget really is sparse


def drifting_driver(steps=60, seed=3):
    """Queries that move from block to block, so the important blocks drift."""
    driver = make_driver([320], steps=steps, seed=seed)
    for (b, l), (k, _) in driver.prompts.items():
        for s in range(steps):
            target = k[BLOCK * (4 + 2 * (s // 8)) + 3]  # the key a query follows moves on every 8 steps
            driver.queries[s, l, b] = 4.0 * target.repeat_interleave(SHAPE.group_size, dim=0)
    driver.predicted = driver.queries.clone()
    return driver


def mean_cpu_ratio(telemetry, skip=10):
    ratios = [t.totals().cpu_ratio for t in telemetry[skip:]]
    return sum(ratios) / len(ratios)


def test_recall_keeps_the_cpu_ratio_under_beta_where_it_drifts_upward_without_recall():
    driver = drifting_driver()
    _, without = run(driver, make_engine("scout", budget=96, recall_policy="off"))
    _, adaptive = run(driver, make_engine("scout", budget=96, recall_policy="adaptive", recall_beta=0.12))
    early, late = mean_cpu_ratio(without[:20], skip=0), mean_cpu_ratio(without[-20:], skip=0)
    assert late > early and late > 0.12  # drifts upward without recall
    assert mean_cpu_ratio(adaptive) < 0.12
    assert sum(t.totals().recalled_blocks for t in adaptive) > 0


def test_interval_recall_runs_on_schedule():
    driver = drifting_driver(steps=12)
    _, telemetry = run(driver, make_engine("scout", budget=96, recall_policy="interval", recall_interval=4))
    recalled_steps = [t.step for t in telemetry if t.totals().recalled_blocks > 0]
    assert recalled_steps and all((step + 1) % 4 == 0 for step in recalled_steps)


def test_a_thousand_requests_leave_no_state_behind():
    engine = make_engine("scout", budget=48)
    baseline = engine.usage()
    k, v = torch.randn(40, 2, 32), torch.randn(40, 2, 32)
    for rid in range(1000):
        engine.add_request(rid)
        for layer in range(SHAPE.num_layers):
            engine.prefill(rid, layer, k, v)
        if rid % 50 == 0:  # a few decode a step before leaving
            engine.begin_step([rid])
            for layer in range(SHAPE.num_layers):
                engine.attend(layer, torch.randn(1, 8, 32), torch.randn(1, 2, 32), torch.randn(1, 2, 32))
            engine.end_step()
        engine.release_request(rid)
    assert engine.usage() == baseline
    engine.offloaded.host_pages.check_consistent()
    engine.close()


def test_a_failing_cpu_task_is_computed_by_the_layer_and_logged_naming_its_request_and_layer(caplog):
    worker = FlagWorker(threads=1, impl="torch")  # the Python worker: its kernel is the unit to break
    config = ScoutConfig(mode="hgca", block_size=BLOCK, token_budget=48, sink_blocks=1, local_blocks=2)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=512,
                               cpu_worker=worker)
    engine.add_request(7)
    for layer in range(SHAPE.num_layers):
        engine.prefill(7, layer, torch.randn(90, 2, 32), torch.randn(90, 2, 32))
    kernel = worker._kernel
    healthy = kernel.decode

    def failing_decode(*args, **kwargs):  # the unit boundary: the CPU kernel itself fails
        raise RuntimeError("simulated kernel fault")

    kernel.decode = failing_decode
    engine.begin_step([7])
    with caplog.at_level("WARNING", logger="scout_sglang"):
        for layer in range(SHAPE.num_layers):
            engine.attend(layer, torch.randn(1, 8, 32), torch.randn(1, 2, 32), torch.randn(1, 2, 32))
    assert engine.end_step().cpu_fallbacks == {"error": SHAPE.num_layers - 1}  # every offloaded layer
    assert re.search(r"layer 1 was computed by the layer itself \(error: .*sequence 7.*layer 1", caplog.text)
    kernel.decode = healthy  # the pool keeps serving
    engine.begin_step([7])
    for layer in range(SHAPE.num_layers):
        engine.attend(layer, torch.randn(1, 8, 32), torch.randn(1, 2, 32), torch.randn(1, 2, 32))
    assert engine.end_step().cpu_fallbacks == {}
    engine.close()
    worker.shutdown()


@requires_cuda
@pytest.mark.parametrize("mode", MODES)
def test_the_engine_on_cuda_matches_the_engine_on_cpu(mode):
    """Same inputs on both devices (recall on a side stream on CUDA): same outputs."""
    driver = drifting_driver(steps=16)
    cpu, _ = run(driver, make_engine(mode, budget=96))
    config = ScoutConfig(mode=mode, block_size=BLOCK, token_budget=96, sink_blocks=1, local_blocks=2, cpu_groups=1)
    gpu_engine = CoAttentionEngine(config, SHAPE, device="cuda", dtype=torch.float32, max_requests=4,
                                   max_tokens_per_request=512)
    gpu, _ = run(driver, CudaInputs(gpu_engine))
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-4)


class CudaInputs:
    """Moves a Driver's CPU tensors to the GPU for an engine living there."""

    def __init__(self, engine):
        self.engine = engine

    def __getattr__(self, name):
        attr = getattr(self.engine, name)
        if name not in ("prefill", "predict", "attend"):
            return attr
        return lambda *args: attr(*[a.cuda() if isinstance(a, torch.Tensor) else a for a in args])
