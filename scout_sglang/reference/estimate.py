"""Reference estimate of the blocks a layer does not attend: one more partial attention, from block summaries.

digest -> select -> device part / CPU part -> **estimate** -> merge. A full block b
that is neither selected, nor attended on the device (window, resident buffer),
nor on the CPU list stands in as if each of its n_b keys were its key summary
kbar_b and each value its mean value vbar_b:

    weight_b = n_b * exp(scale * q . kbar_b)        value_b = vbar_b
    lse = log(sum_b weight_b)                       o = sum_b weight_b * vbar_b / sum_b weight_b

kbar_b is the midpoint of the block's digest, (min + max) / 2 per channel. The
estimate is merged by LSE with the parts that were attended exactly. With no
block left over it is empty (lse = -inf) and changes nothing; when every key of
a block is the same, it is that block's exact contribution. Natural-log LSE,
fp32, loops for clarity.
"""

from __future__ import annotations

import math

import torch


def block_summaries(k: torch.Tensor, v: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key summary and mean value of every full block of one request.

    Parameters
    ----------
    k, v : [N, Hkv, D], the request's tokens in order

    Returns
    -------
    key_summary, value_mean : [N // block_size, Hkv, D] fp32
    """
    num_full = k.shape[0] // block_size
    blocks_k = k[: num_full * block_size].float().view(num_full, block_size, *k.shape[1:])
    blocks_v = v[: num_full * block_size].float().view(num_full, block_size, *v.shape[1:])
    key_summary = (blocks_k.amin(dim=1) + blocks_k.amax(dim=1)) / 2
    return key_summary, blocks_v.mean(dim=1)


def estimate_blocks(q: torch.Tensor, key_summary: torch.Tensor, value_mean: torch.Tensor,
                    blocks_per_head: list[list[int]], *, block_size: int,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The estimate of one request's listed blocks, per KV head.

    Parameters
    ----------
    q : [Hq, D]
    key_summary, value_mean : [NB, Hkv, D] per logical block (block_summaries, or the stored digests' midpoints
        and mean values: a reference starts from the same rounded inputs as the kernel)
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
        vbar = value_mean[blocks, h].float()
        logits = scale * q[heads].float() @ kbar.T + math.log(block_size)  # [G, n]: log of n_b * exp(scale q.kbar)
        lse[heads] = torch.logsumexp(logits, dim=-1)
        o[heads] = torch.softmax(logits, dim=-1) @ vbar
    return o, lse
