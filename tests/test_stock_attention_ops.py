"""The stock CPU attention's op counts, as the planner's validation prices them: fixed + per request x B."""

import pytest

pytest.importorskip("sglang")

from scout_sglang.sglang_adapter.stock_attention_ops import _count, stock_decode_counts  # noqa: E402


def test_the_counts_are_a_fixed_part_and_a_part_per_request():
    shape = dict(num_qo_heads=4, num_kv_heads=2, head_dim=16)
    counts = stock_decode_counts(**shape)
    assert counts.launches_per_request > 0 and counts.scalar_reads_per_request > 0  # the loop over requests
    assert counts.ops_per_request >= counts.launches_per_request  # views dispatch without launching
    five = _count(5, 64, shape["num_qo_heads"], shape["num_kv_heads"], shape["head_dim"])
    assert sum(five.ops.values()) == counts.ops_fixed + 5 * counts.ops_per_request
    assert five.launches() == counts.launches_fixed + 5 * counts.launches_per_request
    assert five.reads == 5 * counts.scalar_reads_per_request  # .item() and tolist() alike
