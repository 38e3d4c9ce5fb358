"""Reference estimate of the blocks a layer does not attend: one more partial attention, from block summaries.

digest -> select -> device part / CPU part -> **estimate** -> merge. A full block b
that is neither selected, nor attended on the device (window, resident buffer),
nor on the CPU list stands in as if each of its n_b keys were its key summary
kbar_b, with its attention-weighted value taken to first order in the query:

    weight_b = n_b * exp(scale * q . kbar_b)
    value_b  = vbar_b + scale * (q . x_b) * y_b
    lse = log(sum_b weight_b)                       o = sum_b weight_b * value_b / sum_b weight_b

kbar_b is the midpoint of the block's digest, (min + max) / 2 per channel, and
vbar_b its mean value. The softmax-weighted mean of a block's values moves with
the query by scale * C_b q to first order, C_b = (1/n_b) sum_i (v_i - vbar_b)
(k_i - mean key)^T the block's value-key cross-covariance. The store keeps C_b
at rank 1: x_b, its leading right singular vector by SLOPE_ITERATIONS steps of
power iteration from the all-ones direction, and y_b = C_b x_b (the value's
slope along x_b). Without the slope the mean value stands for every query, and
on a lookup over many blocks (chain) that drowns the blocks that matter.

The estimate is merged by LSE with the parts that were attended exactly. With
no block left over it is empty (lse = -inf) and changes nothing; when every key
of a block is the same, its slope is zero and it is that block's exact
contribution. Natural-log LSE, fp32, loops for clarity.
"""

from __future__ import annotations

import math

import torch

from scout_sglang.layout import AXIS, MEAN, SLOPE, SLOPE_ITERATIONS


def value_summary_of_block(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The value summary of one block and KV head: [3, D] fp32 rows MEAN (vbar), SLOPE (y = C x) and AXIS (x).

    Parameters
    ----------
    k, v : [S, D], the block's keys and values
    """
    k, v = k.float(), v.float()
    cross = (v - v.mean(dim=0)).T @ (k - k.mean(dim=0)) / k.shape[0]  # C [D(v), D(k)]
    axis = torch.full((k.shape[1],), k.shape[1] ** -0.5)
    for _ in range(SLOPE_ITERATIONS):
        axis = cross.T @ (cross @ axis)
        norm = axis.norm()
        axis = axis / norm if norm > 0 else torch.zeros_like(axis)
    summary = torch.empty(3, k.shape[1])
    summary[MEAN], summary[SLOPE], summary[AXIS] = v.mean(dim=0), cross @ axis, axis
    return summary


def block_summaries(k: torch.Tensor, v: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key summary and value summary of every full block of one request.

    Parameters
    ----------
    k, v : [N, Hkv, D], the request's tokens in order

    Returns
    -------
    key_summary : [N // block_size, Hkv, D] fp32
    value_summary : [N // block_size, Hkv, 3, D] fp32 (value_summary_of_block)
    """
    num_full = k.shape[0] // block_size
    blocks_k = k[: num_full * block_size].float().view(num_full, block_size, *k.shape[1:])
    blocks_v = v[: num_full * block_size].float().view(num_full, block_size, *v.shape[1:])
    key_summary = (blocks_k.amin(dim=1) + blocks_k.amax(dim=1)) / 2
    value_summary = torch.stack([torch.stack([value_summary_of_block(blocks_k[b, :, h], blocks_v[b, :, h])
                                              for h in range(k.shape[1])]) for b in range(num_full)]) \
        if num_full else torch.zeros(0, k.shape[1], 3, k.shape[2])
    return key_summary, value_summary


def estimate_blocks(q: torch.Tensor, key_summary: torch.Tensor, value_summary: torch.Tensor,
                    blocks_per_head: list[list[int]], *, block_size: int,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimate of one request's listed blocks, per KV head.

    Parameters
    ----------
    q : [Hq, D]
    key_summary : [NB, Hkv, D], value_summary : [NB, Hkv, 3, D] per logical block (block_summaries, or the stored
        digests' midpoints and value summaries: a reference starts from the same rounded inputs as the kernel)
    blocks_per_head : [Hkv] lists of logical blocks to estimate (full blocks of block_size tokens)

    Returns
    -------
    o : [Hq, D] fp32 (zeros for a head with no block)
    lse : [Hq] fp32 natural log; -inf for a head with no block
    """
    num_qo_heads, head_dim = q.shape
    num_kv_heads = len(blocks_per_head)
    group_size = num_qo_heads // num_kv_heads
    o = torch.zeros(num_qo_heads, head_dim)
    lse = torch.full((num_qo_heads,), float("-inf"))
    for h, blocks in enumerate(blocks_per_head):
        if not blocks:
            continue
        heads = slice(h * group_size, (h + 1) * group_size)
        kbar = key_summary[blocks, h].float()  # [n, D]
        summary = value_summary[blocks, h].float()  # [n, 3, D]
        for g in range(heads.start, heads.stop):
            qg = q[g].float()
            logits = scale * kbar @ qg + math.log(block_size)  # [n]: log of n_b * exp(scale q.kbar)
            values = summary[:, MEAN] + scale * (summary[:, AXIS] @ qg)[:, None] * summary[:, SLOPE]  # [n, D]
            lse[g] = torch.logsumexp(logits, dim=-1)
            o[g] = torch.softmax(logits, dim=-1) @ values
    return o, lse
