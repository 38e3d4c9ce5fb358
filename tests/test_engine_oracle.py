"""CoAttentionEngine against the independent oracle (tests/oracle): every decision of
every step, layer, request and KV head, and every output recomputed from the
driver's own K/V, for all modes at sparse budgets, with block fills, window
admissions, first fills, recalls and CPU lists that overflow."""

import pytest
import torch
from oracle.check import Oracle
from oracle.driver import Driver

from scout_sglang.config import MODES, ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHAPES = {
    "llama": ModelShape(num_layers=3, num_qo_heads=8, num_kv_heads=2, head_dim=32),  # GQA group 4
    "qwen3": ModelShape(num_layers=4, num_qo_heads=8, num_kv_heads=4, head_dim=16),  # GQA group 2
}
# Sparse budgets: 6 blocks of 8 tokens over contexts up to 190 tokens.
SETTINGS = {
    "llama": dict(dense_layers=(0,), recall_policy="adaptive"),
    "qwen3": dict(dense_layers=(), resident_blocks=3, recall_policy="interval", recall_interval=3),
}
LENGTHS = [5, 30, 150, 90]  # one request starts with no full block
STEPS = 36


def run_checked(mode, shape_name, *, dense=False, **overrides):
    """dense: the run must equal dense attention (else, sparse modes must not)."""
    shape = SHAPES[shape_name]
    settings = dict(mode=mode, block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1)
    config = ScoutConfig(**(settings | SETTINGS[shape_name] | overrides))
    driver = Driver(shape, LENGTHS, STEPS, seed=len(mode))
    engine = CoAttentionEngine(config, shape, dtype=torch.float32, max_requests=4, max_tokens_per_request=256,
                               trace=True)
    outputs = driver.run(engine)
    if dense:
        torch.testing.assert_close(outputs, driver.dense(), atol=2e-5, rtol=2e-5)
    elif mode != "full":
        assert (outputs - driver.dense()).abs().max() > 1e-2  # the budget really is sparse
    report = Oracle(config, shape, driver).check(engine.trace.decisions, outputs)
    totals = [step.totals() for step in driver.telemetry]
    for name in ("recalled_blocks", "withheld_blocks", "backed_off_rows"):  # the engine's own counters agree
        assert sum(getattr(t, name) for t in totals) == getattr(report, name), name
    return report


@pytest.mark.parametrize("shape_name", sorted(SHAPES))
@pytest.mark.parametrize("mode", MODES)
def test_every_decision_and_output_matches_the_oracle(mode, shape_name):
    report = run_checked(mode, shape_name)
    assert report.decisions == STEPS * SHAPES[shape_name].num_layers
    assert report.outputs_checked == report.decisions * len(LENGTHS)
    assert report.block_fills > 0
    if mode in ("scout", "hgca"):
        assert report.cpu_blocks > 0
    if mode in ("scout", "infinigen"):
        assert report.predicted_layers > 0 and report.first_fills > 0 and report.admitted_blocks > 0
        assert report.recalled_blocks > 0
    if mode == "scout":  # random keys churn: the brake acts (the hysteresis is off by default: a test below)
        assert report.backed_off_rows > 0 and report.withheld_blocks == 0


@pytest.mark.parametrize("shape_name", sorted(SHAPES))
@pytest.mark.parametrize("overrides, exercised", [
    (dict(recall_bytes_per_step=8192), "capped_blocks"),  # 2 blocks per layer and step: fewer than the rows
    (dict(recall_min_selected=1, recall_brake=False), "recalled_blocks"),  # recall as it was: neither rule
    (dict(recall_min_selected=3, recall_max_backoff=1), "withheld_blocks"),
])
def test_scout_recall_under_its_cap_hysteresis_and_brake_settings(shape_name, overrides, exercised):
    report = run_checked("scout", shape_name, **overrides)
    assert getattr(report, exercised) > 0 and report.recalled_blocks > 0


@pytest.mark.parametrize("mode", ["scout", "hgca"])
def test_a_cpu_list_past_its_capacity_drops_the_least_important_blocks(mode):
    report = run_checked(mode, "qwen3", max_cpu_blocks=1)
    assert report.cpu_blocks > 0


@pytest.mark.parametrize("mode", MODES)
def test_with_the_estimate_every_output_matches_the_oracle(mode):
    """The estimate of the blocks attended nowhere, recomputed by the oracle from the driver's K/V with the real
    query, in every mode (full: nothing to estimate), with first fills, recall and CPU lists."""
    report = run_checked(mode, "llama", estimate=True)
    assert report.outputs_checked == report.decisions * len(LENGTHS)
    if mode == "scout":
        assert report.cpu_blocks > 0 and report.recalled_blocks > 0


def test_the_same_layer_path_without_layer_ahead_prediction():
    report = run_checked("scout", "llama", layer_ahead=False)
    assert report.predicted_layers == 0 and report.cpu_blocks > 0 and report.recalled_blocks > 0


@pytest.mark.parametrize("mode, split", [("scout", "0.0"), ("scout", "0.34"), ("hgca", "0.2"), ("scout", "1.0")])
def test_with_the_cpu_split_every_decision_and_output_matches_the_oracle(mode, split):
    """The CPU list split at fixed caps (none to the workers, a third, a fifth, all): each share as the oracle cuts the
    list, no block in both, their union the list, and every output the merge of the three parts."""
    report = run_checked(mode, "llama", cpu_split=split)
    assert report.outputs_checked == report.decisions * len(LENGTHS)
    assert (report.zero_copy_blocks > 0) == (split != "1.0") and (report.cpu_blocks > 0) == (split != "0.0")
    if mode == "scout":
        assert report.recalled_blocks > 0


def test_with_the_cpu_split_and_the_estimate_every_output_matches_the_oracle():
    report = run_checked("scout", "llama", cpu_split="0.34", estimate=True)
    assert report.zero_copy_blocks > 0 and report.cpu_blocks > 0 and report.recalled_blocks > 0


@pytest.mark.parametrize("pool", [60, 30])
def test_resident_first_quotas_exact_rows_and_their_switch_match_the_oracle(pool):
    """Resident-first serving (core/resident_pool.py) on qwen3's shape (resident_blocks 3): with a pool that holds
    every block, every request is exact (all its blocks resident, no CPU part) and equals dense attention, and
    every step takes the exact path (each prefill wrote its row: nothing selected); with one that does not, the
    largest requests turn sparse as the others grow, their rows compacted (those exact since their last sparse
    step keep their newest blocks), and every decision (quota, exactness, selection, the rows through the switch)
    and output matches the oracle."""
    report = run_checked("scout", "qwen3", dense=pool == 60, resident_first=True, resident_pool_blocks=pool)
    rows = STEPS * SHAPES["qwen3"].num_layers * len(LENGTHS) * SHAPES["qwen3"].num_kv_heads
    if pool == 60:  # every step on the exact path (each prefill wrote its row): no selection, every block attended
        assert report.exact_rows == rows and report.cpu_blocks == 0 and report.quota_shrinks == 0
        assert report.exact_path_rows == rows
    else:
        assert 0 < report.exact_rows < rows and report.cpu_blocks > 0 and report.quota_shrinks > 0
