"""The references themselves, checked against first principles."""

import math

import pytest
import torch

from scout_sglang import reference


def naive_attention(q, k, v, scale):
    """Softmax written out per query head with explicit sums, fp64."""
    num_qo_heads = q.shape[0]
    group_size = num_qo_heads // k.shape[1]
    outs, lses = [], []
    for head in range(num_qo_heads):
        kv_head = head // group_size
        logits = [scale * float(q[head].double() @ k[t, kv_head].double()) for t in range(k.shape[0])]
        m = max(logits)
        weights = [math.exp(x - m) for x in logits]
        total = sum(weights)
        outs.append(sum(w * v[t, kv_head].double() for t, w in enumerate(weights)) / total)
        lses.append(m + math.log(total))
    return torch.stack(outs).float(), torch.tensor(lses, dtype=torch.float32)


@pytest.mark.parametrize("group_size", [1, 4])
def test_dense_decode_matches_written_out_softmax(group_size):
    torch.manual_seed(0)
    q = torch.randn(2 * group_size, 8)
    k, v = torch.randn(13, 2, 8), torch.randn(13, 2, 8)
    o, lse = reference.dense_decode(q, k, v, scale=0.3)
    o_naive, lse_naive = naive_attention(q, k, v, 0.3)
    torch.testing.assert_close(o, o_naive, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, lse_naive, atol=1e-5, rtol=1e-5)


def test_dense_decode_of_no_tokens_is_empty_state():
    o, lse = reference.dense_decode(torch.randn(4, 8), torch.zeros(0, 2, 8), torch.zeros(0, 2, 8), scale=1.0)
    assert torch.all(o == 0) and torch.all(torch.isneginf(lse))


def test_merge_of_two_halves_is_the_whole():
    torch.manual_seed(1)
    q, k, v = torch.randn(4, 8), torch.randn(20, 1, 8), torch.randn(20, 1, 8)
    whole = reference.dense_decode(q, k, v, scale=0.5)
    first = reference.dense_decode(q, k[:7], v[:7], scale=0.5)
    second = reference.dense_decode(q, k[7:], v[7:], scale=0.5)
    o, lse = reference.merge_states(first[0], first[1], second[0], second[1])
    torch.testing.assert_close(o, whole[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, whole[1], atol=1e-5, rtol=1e-5)


def test_quest_score_bounds_every_dot_product_in_the_block():
    torch.manual_seed(2)
    k_cache = torch.randn(5, 2, 16, 8)
    q = torch.randn(4, 8)
    kmin, kmax = reference.block_digests(k_cache)
    scores = reference.quest_scores(q, kmin, kmax)  # [Hkv, n]
    for page in range(5):
        for head in range(2):
            best = max(float(q[g] @ k_cache[page, head, t]) for g in (2 * head, 2 * head + 1) for t in range(16))
            assert scores[head, page] >= best - 1e-5


def test_select_topk_forces_sink_and_local_then_best_with_low_index_ties():
    scores = torch.tensor([0.0, 5.0, 5.0, 9.0, 1.0, 2.0, 3.0])
    chosen = reference.select_topk(scores, topk=5, num_sink_blocks=1, num_local_blocks=2)
    assert chosen == [0, 5, 6, 3, 1]  # forced ascending, then 9, then the 5.0 tie goes to block 1


def test_split_selection_keeps_order_and_reports_overflow():
    cpu, dropped = reference.split_selection([4, 9, 2, 7, 1], [9, 1], capacity=2)
    assert cpu == [4, 2] and dropped == 1
