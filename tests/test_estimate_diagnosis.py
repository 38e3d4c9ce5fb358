"""benchmarks/estimate_diagnosis.py: its variants of the estimate compute what they claim. `midpoint` is the
shipped estimate without its slope; `exact` is attention over every token of the unattended blocks; `true-mass`
and `true-value` each take one half from `exact` and the other from the summaries."""

import copy
import importlib.util
import math
from pathlib import Path

import pytest
import torch
from support import assert_close
from test_kernels_estimate import BLOCK, HEADS, SCALE, layer

from scout_sglang import reference
from scout_sglang.kernels.estimate import estimate_torch, unattended_mask
from scout_sglang.layout import SLOPE

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def diagnosis():
    spec = importlib.util.spec_from_file_location("estimate_diagnosis", ROOT / "benchmarks" / "estimate_diagnosis.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_pages(diagnosis, group, seed=0):
    q, blocks, (k_pages, v_pages) = layer(group, seed=seed)
    diagnosis.RAW_PAGES[blocks.value_summary.data_ptr()] = (k_pages, v_pages)
    return q, blocks, (k_pages, v_pages)


def dense_over_unattended(q, blocks, k_pages, v_pages):
    """Per row: attention over every token of the blocks the layer attends nowhere (blocks of one token each)."""
    mask = unattended_mask(blocks)
    out_o, out_lse = [], []
    for b in range(q.shape[0]):
        pages = blocks.block_table[b].clamp(min=0).long()
        keys = k_pages[pages].transpose(1, 2).reshape(-1, HEADS, k_pages.shape[-1])  # [NB * S, Hkv, D]
        values = v_pages[pages].transpose(1, 2).reshape(-1, HEADS, v_pages.shape[-1])
        tokens = [[j * BLOCK + s for j in mask[b, h].nonzero().flatten().tolist() for s in range(BLOCK)]
                  for h in range(HEADS)]
        one_token = torch.stack([values, torch.zeros_like(values), torch.zeros_like(values)], dim=2)  # no slope
        o, lse = reference.estimate_blocks(q[b], keys, one_token, tokens, block_size=1, scale=SCALE)
        out_o.append(o)
        out_lse.append(lse)
    return torch.stack(out_o), torch.stack(out_lse)


@pytest.mark.parametrize("group", [1, 4])
def test_midpoint_is_the_shipped_estimate_without_slope_and_exact_is_attention_over_the_unattended_tokens(
        diagnosis, group):
    q, blocks, (k_pages, v_pages) = with_pages(diagnosis, group)
    flat = copy.copy(blocks)
    flat.value_summary = blocks.value_summary.clone()
    flat.value_summary[:, :, SLOPE] = 0
    midpoint_o, midpoint_lse = diagnosis.variant_estimate("midpoint")(q, blocks)
    for got, expected in zip((midpoint_o, midpoint_lse), estimate_torch(q, flat)):
        assert_close(got, expected, torch.float32)
    assert (midpoint_o - estimate_torch(q, blocks)[0]).abs().max() > 1e-3  # the slope moves the shipped one
    exact_o, exact_lse = diagnosis.variant_estimate("exact")(q, blocks)
    dense_o, dense_lse = dense_over_unattended(q, blocks, k_pages, v_pages)
    assert_close(exact_o, dense_o, torch.float32)
    assert_close(exact_lse, dense_lse, torch.float32, lse=True)
    shipped_o, shipped_lse = estimate_torch(q, blocks)
    assert (exact_o - shipped_o).abs().max() > 0.05  # random keys: the summaries are not exact


def test_true_mass_and_true_value_take_one_half_each_from_exact(diagnosis):
    q, blocks, _ = with_pages(diagnosis, 2, seed=3)
    exact_o, exact_lse = diagnosis.variant_estimate("exact")(q, blocks)
    shipped_o, shipped_lse = estimate_torch(q, blocks)
    true_mass_o, true_mass_lse = diagnosis.variant_estimate("true-mass")(q, blocks)
    true_value_o, true_value_lse = diagnosis.variant_estimate("true-value")(q, blocks)
    assert_close(true_mass_lse, exact_lse, torch.float32, lse=True)
    assert_close(true_value_lse, shipped_lse, torch.float32, lse=True)
    assert (true_mass_o - exact_o).abs().max() > 0.05 and (true_value_o - shipped_o).abs().max() > 0.05


def test_the_variants_are_swapped_in_and_restored(diagnosis):
    import scout_sglang.kernels.estimate as shipped

    kept = shipped.estimate_torch
    with diagnosis.estimated_as("exact"):
        assert shipped.estimate_torch is not kept
    with diagnosis.estimated_as("shipped"):
        assert shipped.estimate_torch is kept
    assert shipped.estimate_torch is kept


def test_sub_blocks_of_one_token_are_exact_and_one_sub_block_is_the_midpoint(diagnosis):
    q, blocks, (k_pages, v_pages) = with_pages(diagnosis, 2, seed=5)
    qf = q.float().view(q.shape[0], HEADS, 2, q.shape[-1])
    pages = blocks.block_table.clamp(min=0).long()
    keys, values = k_pages[pages].transpose(1, 2), v_pages[pages].transpose(1, 2)
    one_token_logits, one_token_value = diagnosis.sub_block_estimate(qf, keys, values, BLOCK, SCALE)
    token_logits = torch.einsum("bhgd,bhnsd->bhgns", qf, keys) * SCALE
    assert_close(one_token_logits, torch.logsumexp(token_logits, dim=-1), torch.float32)
    exact_value = torch.einsum("bhgns,bhnsd->bhgnd", torch.softmax(token_logits, dim=-1), values)
    assert_close(one_token_value, exact_value, torch.float32)
    whole_logits, _ = diagnosis.sub_block_estimate(qf, keys, values, 1, SCALE)
    midpoint = (blocks.digest_min[pages] + blocks.digest_max[pages]).transpose(1, 2) * 0.5
    assert_close(whole_logits, torch.einsum("bhgd,bhnd->bhgn", qf, midpoint) * SCALE + math.log(BLOCK), torch.float32)
    halves_o, _ = diagnosis.variant_estimate("halves")(q, blocks)
    exact_o, _ = diagnosis.variant_estimate("exact")(q, blocks)
    shipped_o, _ = estimate_torch(q, blocks)
    assert (halves_o - exact_o).abs().max() > 1e-3 and (halves_o - shipped_o).abs().max() > 1e-3


def test_first_order_is_exact_to_first_order_in_the_query(diagnosis):
    """With the query scaled towards 0 the block's exact value is vbar + s C q + O(q^2): first-order's error
    shrinks as the square of the scale, the mean value's only linearly."""
    q, blocks, _ = with_pages(diagnosis, 2, seed=7)
    errors = []
    for factor in (0.1, 0.05):
        exact_o, _ = diagnosis.variant_estimate("true-value")(q * factor, blocks)
        first_o, _ = diagnosis.variant_estimate("first-order")(q * factor, blocks)
        mean_o, _ = diagnosis.variant_estimate("midpoint")(q * factor, blocks)
        errors.append(((first_o - exact_o).abs().max().item(), (mean_o - exact_o).abs().max().item()))
    (first_big, mean_big), (first_small, mean_small) = errors
    assert first_small < first_big / 3 and mean_small > mean_big / 3  # quadratic against linear
    assert first_small < mean_small / 10


def test_a_truncation_of_the_cross_covariance_to_its_full_rank_is_the_full_first_order(diagnosis, monkeypatch):
    q, blocks, _ = with_pages(diagnosis, 2, seed=9)
    full_o, _ = diagnosis.variant_estimate("first-order")(q, blocks)
    rank_one_o, _ = diagnosis.variant_estimate("first-order-r1")(q, blocks)
    monkeypatch.setitem(diagnosis.RANKS, "first-order-r1", BLOCK)  # C of a block of BLOCK tokens: rank < BLOCK
    all_o, _ = diagnosis.variant_estimate("first-order-r1")(q, blocks)
    assert_close(all_o, full_o, torch.float32)
    assert (rank_one_o - full_o).abs().max() > 1e-3
