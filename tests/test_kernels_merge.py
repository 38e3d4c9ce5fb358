"""kernels.merge_attention_states(_) against the reference and its invariants."""

import pytest
import torch
from support import assert_close, requires_cuda

from scout_sglang import kernels, reference
from scout_sglang.kernels.dispatch import is_available


def states(n=5, heads=4, dim=64, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(n, heads, dim, generator=gen).to(dtype)
    lse = torch.randn(n, heads, generator=gen) * 3
    return o, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_merge_matches_reference(dtype):
    o_a, lse_a = states(dtype=dtype, seed=1)
    o_b, lse_b = states(dtype=dtype, seed=2)
    o, lse = kernels.merge_attention_states(o_a, lse_a, o_b, lse_b)
    ref_o, ref_lse = reference.merge_states(o_a, lse_a, o_b, lse_b)
    assert o.dtype == dtype
    assert_close(o, ref_o, dtype)
    assert_close(lse, ref_lse, torch.float32, lse=True)


def test_an_empty_side_changes_nothing_and_two_empty_sides_stay_empty():
    o_a, lse_a = states(seed=3)
    o_b, lse_b = states(seed=4)
    lse_b[:2] = float("-inf")  # rows 0, 1: side b empty
    lse_a[2] = float("-inf")  # row 2: side a empty
    lse_a[3], lse_b[3] = float("-inf"), float("-inf")  # row 3: both empty
    o, lse = kernels.merge_attention_states(o_a, lse_a, o_b, lse_b)
    assert torch.equal(o[:2], o_a[:2]) and torch.equal(lse[:2], lse_a[:2])
    torch.testing.assert_close(o[2], o_b[2])
    torch.testing.assert_close(lse[2], lse_b[2])
    assert torch.all(o[3] == 0) and torch.all(torch.isneginf(lse[3]))
    assert not torch.isnan(o).any()


def test_in_place_equals_out_of_place():
    o_a, lse_a = states(seed=5)
    o_b, lse_b = states(seed=6)
    expected = kernels.merge_attention_states(o_a, lse_a, o_b, lse_b)
    kernels.merge_attention_states_(o_a, lse_a, o_b, lse_b)
    assert torch.equal(o_a, expected[0]) and torch.equal(lse_a, expected[1])


def test_merge_accepts_a_cpu_side_in_fp32_against_a_bf16_device_side():
    """The engine merges the CPU worker's fp32 output into the device's bf16 one: the result is the
    reference merge of those same inputs, rounded once to bf16, also where either side is empty."""
    o_a, lse_a = states(dtype=torch.bfloat16, seed=7)  # device side
    o_b, lse_b = states(dtype=torch.float32, seed=8)  # CPU side
    lse_a[0] = float("-inf")  # row 0: the device side is empty
    lse_b[1] = float("-inf")  # row 1: the CPU side is empty
    o, lse = kernels.merge_attention_states(o_a, lse_a, o_b, lse_b)
    ref_o, ref_lse = reference.merge_states(o_a, lse_a, o_b, lse_b)
    assert o.dtype == torch.bfloat16
    assert_close(o, ref_o, torch.bfloat16)
    assert_close(lse, ref_lse, torch.bfloat16, lse=True)
    assert torch.equal(o[0], o_b[0].to(torch.bfloat16)) and torch.equal(o[1], o_a[1])
    assert torch.equal(lse[0], lse_b[0]) and torch.equal(lse[1], lse_a[1])


def test_mismatched_shapes_are_refused():
    o_a, lse_a = states()
    with pytest.raises(ValueError, match="lse_b must have shape"):
        kernels.merge_attention_states(o_a, lse_a, o_a, lse_a[:, :2].contiguous())


@requires_cuda
@pytest.mark.parametrize("impl", ["flashinfer", "triton", "torch"])
def test_every_cuda_path_keeps_the_empty_side_rules(impl):
    if not is_available(impl, "cuda"):
        pytest.skip(f"{impl} not installed")
    o_a, lse_a = states(dtype=torch.bfloat16, seed=3)
    o_b, lse_b = states(dtype=torch.bfloat16, seed=4)
    lse_b[:2] = float("-inf")
    lse_a[3], lse_b[3] = float("-inf"), float("-inf")
    o, lse = kernels.merge_attention_states(o_a.cuda(), lse_a.cuda(), o_b.cuda(), lse_b.cuda(), impl=impl)
    ref_o, ref_lse = reference.merge_states(o_a, lse_a, o_b, lse_b)
    assert_close(o, ref_o, torch.bfloat16)
    assert torch.all(torch.isneginf(lse[3].cpu())) and not torch.isnan(o).any()
