"""The engine's Triton path, end to end, equals its torch path in every mode.

A GPU runs the Triton path: its stages and their host code (the replayed launches of launch_program.py, the
hand-off's gated fallback and merge) are exercised here as a whole, under Triton's interpreter at tiny shapes
(on the GPU where there is one), not only kernel by kernel: the same outputs as the torch path, and the same decisions (the step's counters),
over steps with first fills, block fills, interval recall and the CPU part.
"""

import pytest
import torch
from oracle.driver import Driver
from support import TRITON_DEVICE, requires_triton

from scout_sglang.config import MODES, ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape

pytestmark = [requires_triton, pytest.mark.triton_interpret, pytest.mark.usefixtures("one_torch_thread")]
SHAPE = ModelShape(num_layers=3, num_qo_heads=4, num_kv_heads=2, head_dim=16)
COUNTERS = ("selected_blocks", "cpu_blocks", "dropped_blocks", "recalled_blocks", "changed_blocks", "withheld_blocks",
            "backed_off_rows", "zero_copy_blocks")


def run(mode, impl, steps=6, prompts=(20, 41, 7), max_tokens=128, rows=None, exact_path=True, **overrides):
    """-> (outputs, each step's COUNTERS); `rows` (a list) gets the engine's resident row width; exact_path:
    resident-first's exact path on (engine.exact_path)."""
    settings = dict(mode=mode, block_size=8, token_budget=32, sink_blocks=1, local_blocks=1, cpu_groups=1,
                    resident_blocks=2, recall_policy="interval", recall_interval=2, kernel_impl=impl)
    engine = CoAttentionEngine(ScoutConfig(**(settings | overrides)), SHAPE, device=TRITON_DEVICE, dtype=torch.float32,
                               max_requests=3, max_tokens_per_request=max_tokens)
    engine.exact_path = exact_path
    if rows is not None:
        rows.append(engine.offloaded.resident_width)
    # 7 tokens: a request with no full block at first
    driver = Driver(SHAPE, list(prompts), steps, seed=1, device=TRITON_DEVICE)
    outputs = driver.run(engine)
    return outputs, [[getattr(step.totals(), name) for name in COUNTERS] for step in driver.telemetry]


@pytest.mark.parametrize("mode", MODES)
def test_the_triton_path_decodes_and_decides_like_the_torch_path(mode):
    torch_outputs, torch_counts = run(mode, "torch")
    triton_outputs, triton_counts = run(mode, "triton")
    torch.testing.assert_close(triton_outputs, torch_outputs, atol=2e-5, rtol=2e-5)
    assert triton_counts == torch_counts
    if mode == "scout":
        assert sum(step[1] for step in torch_counts) > 0 and sum(step[3] for step in torch_counts) > 0


@pytest.mark.parametrize("mode", ["quest", "infinigen", "scout"])
def test_with_the_estimate_the_triton_path_decodes_like_the_torch_path(mode):
    """The estimate merged in its own launch (quest, infinigen) and in the CPU part's merge (scout)."""
    torch_outputs, torch_counts = run(mode, "torch", estimate=True)
    triton_outputs, triton_counts = run(mode, "triton", estimate=True)
    torch.testing.assert_close(triton_outputs, torch_outputs, atol=2e-5, rtol=2e-5)
    assert triton_counts == torch_counts
    assert (torch_outputs - run(mode, "torch")[0]).abs().max() > 1e-3  # the estimate changed the outputs


def test_the_adaptive_recall_and_a_capped_cpu_list_agree_too():
    settings = dict(recall_policy="adaptive", recall_beta=0.1, max_cpu_blocks=1, token_budget=48, resident_blocks=1)
    torch_outputs, torch_counts = run("scout", "torch", **settings)
    triton_outputs, triton_counts = run("scout", "triton", **settings)
    torch.testing.assert_close(triton_outputs, torch_outputs, atol=2e-5, rtol=2e-5)
    assert triton_counts == torch_counts
    assert sum(step[2] for step in torch_counts) > 0  # the capacity dropped blocks


def test_recall_with_hysteresis_brake_and_a_binding_cap_agrees_too():
    """Every request and head through the Triton kernel's brake: runs, back-off and the per-row caps of a cap
    smaller than the rows (2 blocks per layer and step for 6 rows)."""
    block_bytes = 2 * 8 * SHAPE.head_dim * 4
    settings = dict(recall_policy="adaptive", recall_beta=0.1, token_budget=48, resident_blocks=3,
                    recall_min_selected=2, recall_bytes_per_step=2 * block_bytes * 2)
    torch_outputs, torch_counts = run("scout", "torch", steps=16, **settings)
    triton_outputs, triton_counts = run("scout", "triton", steps=16, **settings)
    torch.testing.assert_close(triton_outputs, torch_outputs, atol=2e-5, rtol=2e-5)
    assert triton_counts == torch_counts
    totals = [sum(step[i] for step in torch_counts) for i in range(len(COUNTERS))]
    assert totals[3] > 0 and totals[5] > 0  # recalled, and withheld by the hysteresis


def test_with_the_cpu_split_the_triton_path_decodes_like_the_torch_path():
    """The split stage's shares, the zero-copy decode over the host store and the three-way merge (with the
    estimate's) on the Triton path: the torch path's outputs and counters."""
    settings = dict(cpu_split="0.17", token_budget=48, resident_blocks=1, estimate=True)  # a cap of 1
    torch_outputs, torch_counts = run("scout", "torch", **settings)
    triton_outputs, triton_counts = run("scout", "triton", **settings)
    torch.testing.assert_close(triton_outputs, torch_outputs, atol=2e-5, rtol=2e-5)
    assert triton_counts == torch_counts
    assert sum(step[1] for step in torch_counts) > 0 and sum(step[-1] for step in torch_counts) > 0


def test_resident_first_the_triton_path_decodes_like_the_torch_path():
    """Resident-first (core/resident_pool.py) with a pool of 7 pages: every request exact at first (each row's k
    and fill quota from the plan, resident columns from the pool's device table), until the 41-token request
    outgrows its share and turns sparse, with a CPU part: the same outputs and decisions as the torch path."""
    settings = dict(resident_first=True, resident_pool_blocks=7)
    torch_outputs, torch_counts = run("scout", "torch", steps=10, **settings)
    triton_outputs, triton_counts = run("scout", "triton", steps=10, **settings)
    torch.testing.assert_close(triton_outputs, torch_outputs, atol=2e-5, rtol=2e-5)
    assert triton_counts == torch_counts
    assert sum(torch_counts[0][1:2]) == 0 and sum(step[1] for step in torch_counts) > 0  # exact, then a CPU part


@pytest.mark.parametrize("exact_path", [False, True])
def test_resident_first_rows_of_hundreds_of_blocks_decode_like_the_torch_path(exact_path):
    """Rows wider than the 256 blocks the all-pairs stages took (kernels/triton/lists.py): a request of 265 blocks
    at blocks of 2, exact in a pool that holds it, with no CPU part; the same outputs and decisions as the torch
    path, whose row is as wide. Its prefill wrote its row, so with the exact path on every step takes it (nothing
    selected: the wide admission and list alone); off, the selecting stages run at that width."""
    settings = dict(resident_first=True, resident_pool_blocks=300, block_size=2, prompts=(530, 7), max_tokens=560,
                    steps=2, exact_path=exact_path)
    rows = []
    torch_outputs, torch_counts = run("scout", "torch", rows=rows, **settings)
    triton_outputs, triton_counts = run("scout", "triton", rows=rows, **settings)
    assert rows[0] == rows[1] > 256
    torch.testing.assert_close(triton_outputs, torch_outputs, atol=2e-5, rtol=2e-5)
    assert triton_counts == torch_counts
    assert all(step[1] == 0 for step in torch_counts)
    if exact_path:
        assert all(step[0] == 0 for step in torch_counts)  # nothing selected: the exact path
    else:
        assert torch_counts[0][0] > 2 * 256  # exact: 2 heads x 265 selected
