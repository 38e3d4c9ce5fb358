"""Quest block scores: upper bound of q.k per block, reduced over each GQA group.

Second op of digest -> select -> device part / CPU part -> merge: the scores
feed the top-k selection. Entries past each request's block count are -inf, so
a top-k over the padded row never picks them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from scout_sglang.kernels.triton.sizes import cdiv, p2

_GROUP_REDUCE_MAX = 0
_GROUP_REDUCE_SUM = 1
_GROUP_REDUCE = {"max": _GROUP_REDUCE_MAX, "sum": _GROUP_REDUCE_SUM}

# Logical blocks scored per program: [BLOCK_N, D] digest tiles of min and max.
_BLOCK_N = 32


@triton.jit
def _quest_score_kernel(
    q_ptr,
    min_ptr,
    max_ptr,
    block_table_ptr,
    num_blocks_ptr,
    out_ptr,
    stride_q_batch,
    stride_q_head,
    stride_min_page,
    stride_min_head,
    stride_max_page,
    stride_max_head,
    stride_bt_batch,
    stride_nb_batch,
    stride_out_batch,
    stride_out_head,
    max_num_blocks,
    num_pages,
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GROUP_REDUCE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # grid: (B, Hkv, cdiv(NBmax, BLOCK_N)).
    batch = tl.program_id(0)
    kv_head = tl.program_id(1)
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    num_blocks = tl.load(num_blocks_ptr + batch * stride_nb_batch)
    in_row = offs_n < max_num_blocks
    valid = in_row & (offs_n < num_blocks)
    # Pages of entries past num_blocks may be padding (-1): never dereferenced.
    pages = tl.load(block_table_ptr + batch * stride_bt_batch + offs_n, mask=valid, other=0).to(tl.int64)
    # A page outside the digest store (a corrupt page table: the split stage names it) reads page 0's digest.
    pages = tl.where((pages >= 0) & (pages < num_pages), pages, 0)
    tile_mask = valid[:, None] & mask_d[None, :]
    k_min = tl.load(
        min_ptr + pages[:, None] * stride_min_page + kv_head * stride_min_head + offs_d[None, :],
        mask=tile_mask,
        other=0.0,
    ).to(tl.float32)
    k_max = tl.load(
        max_ptr + pages[:, None] * stride_max_page + kv_head * stride_max_head + offs_d[None, :],
        mask=tile_mask,
        other=0.0,
    ).to(tl.float32)

    if GROUP_REDUCE == 0:
        score = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    else:
        score = tl.zeros((BLOCK_N,), tl.float32)
    # One query head at a time: keeps the working set at [BLOCK_N, D] instead
    # of [G, BLOCK_N, D].
    for g in tl.static_range(GROUP_SIZE):
        q_head = kv_head * GROUP_SIZE + g
        q = tl.load(q_ptr + batch * stride_q_batch + q_head * stride_q_head + offs_d, mask=mask_d, other=0.0)
        q = q.to(tl.float32)[None, :]
        head_score = tl.sum(tl.maximum(q * k_min, q * k_max), axis=1)
        if GROUP_REDUCE == 0:
            score = tl.maximum(score, head_score)
        else:
            score = score + head_score

    score = tl.where(valid, score, float("-inf"))
    tl.store(out_ptr + batch * stride_out_batch + kv_head * stride_out_head + offs_n, score, mask=in_row)


def score_blocks_triton(
    q: torch.Tensor,
    digest_min: torch.Tensor,
    digest_max: torch.Tensor,
    block_table: torch.Tensor,
    num_blocks: torch.Tensor,
    out: torch.Tensor,
    *,
    group_reduce: str,
) -> None:
    """Quest scores of every logical block of every request, per KV head.

    Parameters
    ----------
    q : [B, Hq, D], contiguous
    digest_min, digest_max : [P, Hkv, D], cache dtype
    block_table : [B, NBmax] int32, page id of each logical block
    num_blocks : [B] int32, valid logical blocks per request (<= NBmax)
    out : [B, Hkv, NBmax] fp32; score = sum_d max(q_d*kmin_d, q_d*kmax_d) per
        query head, reduced over the G heads of each KV head by `group_reduce`
        ("max" or "sum"); entries j >= num_blocks[b] are -inf
    """
    batch_size, num_qo_heads, head_dim = q.shape
    num_kv_heads = digest_min.shape[1]
    max_num_blocks = block_table.shape[1]
    if batch_size == 0 or max_num_blocks == 0:
        return
    grid = (batch_size, num_kv_heads, cdiv(max_num_blocks, _BLOCK_N))
    _quest_score_kernel[grid](
        q,
        digest_min,
        digest_max,
        block_table,
        num_blocks,
        out,
        q.stride(0),
        q.stride(1),
        digest_min.stride(0),
        digest_min.stride(1),
        digest_max.stride(0),
        digest_max.stride(1),
        block_table.stride(0),
        num_blocks.stride(0),
        out.stride(0),
        out.stride(1),
        max_num_blocks,
        digest_min.shape[0],
        GROUP_SIZE=num_qo_heads // num_kv_heads,
        HEAD_DIM=head_dim,
        GROUP_REDUCE=_GROUP_REDUCE[group_reduce],
        BLOCK_N=_BLOCK_N,
        BLOCK_D=p2(head_dim),
    )
