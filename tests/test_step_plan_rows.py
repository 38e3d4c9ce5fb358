"""The step plan's fields of a small batch computed request by request (core/step_plan_rows.py) equal the tensor-op
plan_fields (core/step_plan.py) in every mode and setting that changes a field: every field, in the same order,
shape and values, and the same padding, on engines whose requests' lengths complete, start and leave blocks."""

import pytest
import torch

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine, ModelShape
from scout_sglang.core.step_plan import plan_fields
from scout_sglang.core.step_plan_rows import plan_fields_by_row

SHAPE = ModelShape(num_layers=3, num_qo_heads=4, num_kv_heads=2, head_dim=8)
BLOCK = 4
# Tokens before the step's: the step's token completes a block (3, 19, 39, 59), starts one (4, 20), leaves the
# window past the sink (19, 39, 59: 5, 10 and 15 full blocks with sink 1, local 2), or neither (6, 13).
LENGTHS = [3, 4, 6, 13, 19, 20, 39, 59]

SETTINGS = {
    "scout": dict(mode="scout"),
    # 48 pages: 6 (the floor) for each of the 8 requests; the last two need 7 and 12
    "resident-first, some exact": dict(mode="scout", resident_first=True, resident_pool_blocks=48),
    "recall every 2 steps, a recall budget": dict(mode="scout", recall_policy="interval", recall_interval=2,
                                                  max_recall_blocks=2),
    "the CPU split": dict(mode="scout", cpu_split="auto"),
    "hgca": dict(mode="hgca"),
    "infinigen": dict(mode="infinigen"),
    "quest": dict(mode="quest"),
    "full": dict(mode="full"),
}


def engine_with_requests(setting: dict, lengths: list[int]) -> CoAttentionEngine:
    config = ScoutConfig(block_size=BLOCK, token_budget=24, sink_blocks=1, local_blocks=2, dense_layers=(0,),
                         cpu_groups=1, **setting)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=8,
                               max_tokens_per_request=128, track_changes=False)
    gen = torch.Generator().manual_seed(0)
    for rid, length in enumerate(lengths):
        engine.add_request(rid)
        for layer in range(SHAPE.num_layers):
            k, v = torch.randn(2, length, 2, 8, generator=gen)
            engine.prefill(rid, layer, k, v)
    return engine


def same_fields(rows_first: tuple, tensors_first: tuple) -> None:
    (fields, padding), (expected, expected_padding) = rows_first, tensors_first
    assert list(fields) == list(expected)
    for name, tensor in expected.items():
        assert fields[name].shape == tensor.shape, name
        assert torch.equal(fields[name].to(torch.long), tensor.to(torch.long)), name
    assert padding == expected_padding


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_a_small_batchs_fields_computed_row_by_row_equal_the_tensor_ops(setting):
    engine = engine_with_requests(SETTINGS[setting], LENGTHS)
    try:
        rids = list(range(len(LENGTHS)))
        if engine.pool is not None:  # resident-first: the quotas and who is exact come from a step's plan
            engine.begin_step(rids)
            engine.end_step()
            exact = [engine.pool.exact[rid] for rid in rids]
            assert any(exact) and not all(exact)  # the pool holds the short requests whole, not the long ones
        for batch, rows in ((rids, len(rids)), (rids[2:5], 6), (rids[:1], 1)):  # graph padding rows, one request
            engine._batch = [engine.requests[rid] for rid in batch]
            engine._started = {}
            args, kwargs = engine._plan_arguments(rows, False)
            if "host" in kwargs["tables"]:  # rows whose token starts a block the device assigns the page of
                kwargs["started"] = {"host": [0, len(batch) - 1]}
            same_fields(plan_fields_by_row(*args, **kwargs), plan_fields(*args, **kwargs))
    finally:
        engine.close()
