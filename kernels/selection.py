"""Block scoring and top-k selection per (request, KV head).

Second stage of digest -> select -> device part / CPU part -> merge. Scores are
Quest's upper bound of q.k per block; selection is fixed-capacity with counts
(CUDA-graph friendly), forces the sink and local blocks, and breaks ties toward
the lower block index so that a selection is reproducible.
"""

from __future__ import annotations

import torch
from scout_sglang.kernels.checks import (
    check_group_size,
    check_shape,
    check_tensor,
    check_values_in_range,
)
from scout_sglang.kernels.dispatch import select_impl

from scout_sglang.layout import PAD_BLOCK

GROUP_REDUCTIONS = ("max", "sum")


def score_blocks(
    q: torch.Tensor,
    digest_min: torch.Tensor,
    digest_max: torch.Tensor,
    block_table: torch.Tensor,
    num_blocks: torch.Tensor,
    *,
    group_reduce: str = "max",
    out: torch.Tensor | None = None,
    impl: str | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Quest score of every full block of every request, per KV head.

    score = sum_d max(q_d * kmin_d, q_d * kmax_d), reduced over the query heads
    of each GQA group by max (default) or sum.

    Parameters
    ----------
    q : [B, Hq, D], dtype of the digests
    digest_min, digest_max : [P, Hkv, D]
    block_table : [B, NBmax] int32; page id of each logical block of a request
    num_blocks : [B] int32; full blocks of each request (<= NBmax)
    out : optional [B, Hkv, NBmax] fp32
    validate : check the arguments, index ranges included by reading values back (a host
        sync on a GPU); the decode step passes False with static buffers checked once

    Returns
    -------
    scores : [B, Hkv, NBmax] fp32; -inf past num_blocks[b]
    """
    if validate:
        out = _check_score_args(q, digest_min, digest_max, block_table, num_blocks, group_reduce, out)
    elif out is None:
        raise ValueError("score_blocks(validate=False) needs out=")
    device = q.device
    if select_impl("score_blocks", device.type, impl) == "triton":
        from scout_sglang.kernels.triton import score_blocks_triton

        score_blocks_triton(q, digest_min, digest_max, block_table, num_blocks, out, group_reduce=group_reduce)
        return out
    out.copy_(_score_blocks_torch(q, digest_min, digest_max, block_table, num_blocks, group_reduce))
    return out


def _check_score_args(q, digest_min, digest_max, block_table, num_blocks, group_reduce, out):
    """Every argument of score_blocks; returns `out` (allocated when None)."""
    if group_reduce not in GROUP_REDUCTIONS:
        raise ValueError(f"group_reduce must be one of {GROUP_REDUCTIONS}, got {group_reduce!r}")
    check_tensor("digest_min", digest_min, ndim=3)
    device, dtype = digest_min.device, digest_min.dtype
    check_tensor("digest_max", digest_max, ndim=3, dtypes=(dtype,), device=device)
    check_shape("digest_max", digest_max, digest_min.shape)
    check_tensor("q", q, ndim=3, dtypes=(dtype,), device=device)
    batch_size, num_qo_heads, head_dim = q.shape
    _, num_kv_heads, digest_dim = digest_min.shape
    if digest_dim != head_dim:
        raise ValueError(f"q head_dim {head_dim} != digest head_dim {digest_dim}")
    check_group_size(num_qo_heads, num_kv_heads)
    check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=device, contiguous="rows")
    check_tensor("num_blocks", num_blocks, ndim=1, dtypes=(torch.int32,), device=device, contiguous=False)
    if block_table.shape[0] != batch_size or num_blocks.shape[0] != batch_size:
        raise ValueError(
            f"block_table [B, NBmax] and num_blocks [B] need B = {batch_size}, "
            f"got {tuple(block_table.shape)} and {tuple(num_blocks.shape)}"
        )
    max_blocks = block_table.shape[1]
    check_values_in_range("num_blocks", num_blocks, 0, max_blocks)
    check_values_in_range("block_table", block_table, -1, digest_min.shape[0] - 1)
    if out is None:
        return torch.empty(batch_size, num_kv_heads, max_blocks, dtype=torch.float32, device=device)
    check_tensor("out", out, dtypes=(torch.float32,), device=device, contiguous="rows")
    check_shape("out", out, (batch_size, num_kv_heads, max_blocks))
    return out


def _score_blocks_torch(q, digest_min, digest_max, block_table, num_blocks, group_reduce):
    # max(q*kmin, q*kmax) == relu(q)*kmax + min(q, 0)*kmin because kmax >= kmin,
    # so the score is two batched matmuls instead of a [B, Hq, NB, D] temporary.
    batch_size, num_qo_heads, head_dim = q.shape
    num_kv_heads = digest_min.shape[1]
    group_size = num_qo_heads // num_kv_heads
    pages = block_table.long()  # padding reads page 0 (masked below); so does a page outside the store (stage_split)
    pages = torch.where((pages >= 0) & (pages < digest_min.shape[0]), pages, 0)
    kmin = digest_min.index_select(0, pages.flatten()).float()
    kmax = digest_max.index_select(0, pages.flatten()).float()
    max_blocks = block_table.shape[1]
    # An explicit copy to [B, Hkv, D, NB] (matmul would copy by itself for some shapes only: the op
    # sequence would then depend on the batch and head counts).
    kmin = kmin.view(batch_size, max_blocks, num_kv_heads, head_dim).permute(0, 2, 3, 1).clone(memory_format=torch.contiguous_format)
    kmax = kmax.view(batch_size, max_blocks, num_kv_heads, head_dim).permute(0, 2, 3, 1).clone(memory_format=torch.contiguous_format)
    qf = q.float().view(batch_size, num_kv_heads, group_size, head_dim)
    per_head = torch.matmul(qf.clamp(min=0), kmax) + torch.matmul(qf.clamp(max=0), kmin)
    scores = per_head.amax(dim=2) if group_reduce == "max" else per_head.sum(dim=2)
    valid = torch.arange(max_blocks, device=q.device) < num_blocks.unsqueeze(1)  # [B, NBmax]
    return scores.masked_fill(~valid.unsqueeze(1), float("-inf"))


def select_topk(
    scores: torch.Tensor,
    num_blocks: torch.Tensor,
    *,
    topk: int,
    num_sink_blocks: int = 0,
    num_local_blocks: int = 0,
    out_indices: torch.Tensor | None = None,
    out_counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k blocks per (request, KV head), fixed capacity, best first.

    The first `num_sink_blocks` and the last `num_local_blocks` full blocks of
    each request are always chosen, ahead of the rest in ascending order; the
    others follow by score descending, ties to the lower block index.

    Parameters
    ----------
    scores : [B, Hkv, NBmax] fp32 (from score_blocks)
    num_blocks : [B] int32; full blocks of each request
    topk : capacity K, >= num_sink_blocks + num_local_blocks
    out_indices : optional [B, Hkv, K] int32; out_counts : optional [B, Hkv] int32

    Returns
    -------
    indices : [B, Hkv, K] int32 logical block indices, PAD_BLOCK past the count
    counts : [B, Hkv] int32 = min(K, num_blocks[b])
    """
    check_tensor("scores", scores, ndim=3, dtypes=(torch.float32,))
    device = scores.device
    check_tensor("num_blocks", num_blocks, ndim=1, dtypes=(torch.int32,), device=device)
    batch_size, num_kv_heads, _ = scores.shape
    if num_blocks.shape[0] != batch_size:
        raise ValueError(f"num_blocks must have shape ({batch_size},), got {tuple(num_blocks.shape)}")
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if num_sink_blocks < 0 or num_local_blocks < 0:
        raise ValueError(f"sink/local blocks must be >= 0, got {num_sink_blocks}, {num_local_blocks}")
    if topk < num_sink_blocks + num_local_blocks:
        raise ValueError(
            f"topk ({topk}) must cover the forced blocks: num_sink_blocks ({num_sink_blocks}) "
            f"+ num_local_blocks ({num_local_blocks})"
        )
    select_impl("select_topk", device.type, None)
    if out_indices is None:
        out_indices = torch.empty(batch_size, num_kv_heads, topk, dtype=torch.int32, device=device)
    if out_counts is None:
        out_counts = torch.empty(batch_size, num_kv_heads, dtype=torch.int32, device=device)
    check_tensor("out_indices", out_indices, dtypes=(torch.int32,), device=device)
    check_shape("out_indices", out_indices, (batch_size, num_kv_heads, topk))
    check_tensor("out_counts", out_counts, dtypes=(torch.int32,), device=device)
    check_shape("out_counts", out_counts, (batch_size, num_kv_heads))

    select_topk_into(scores, num_blocks, topk, num_sink_blocks, num_local_blocks, out_indices, out_counts)
    return out_indices, out_counts


def select_topk_into(scores, num_blocks, topk, num_sink_blocks, num_local_blocks, out_indices, out_counts,
                     row_topk=None) -> None:
    """select_topk's torch body, unchecked (the decode step's select stage calls it with its static buffers).
    row_topk: optional [B] int32, each row's own k (<= topk): its selection is the first row_topk of the policy's."""
    batch_size, num_kv_heads, max_blocks = scores.shape
    position = torch.arange(max_blocks, device=scores.device)
    n = num_blocks.unsqueeze(1).long()  # [B, 1]
    valid = position < n
    forced = valid & ((position < num_sink_blocks) | (position >= n - num_local_blocks))
    keyed = scores.masked_fill(forced.unsqueeze(1), float("inf"))
    keyed = keyed.masked_fill(~valid.unsqueeze(1), float("-inf"))
    # A stable descending sort keeps equal keys in index order: the tie-break.
    order = torch.sort(keyed, dim=-1, descending=True, stable=True).indices
    take = min(topk, max_blocks)
    limit = num_blocks.clamp(max=topk) if row_topk is None else torch.minimum(num_blocks.clamp(max=topk), row_topk)
    counts = limit.to(torch.int32).unsqueeze(1).expand(batch_size, num_kv_heads)
    keep = torch.arange(take, device=scores.device) < counts.unsqueeze(-1)
    out_indices.fill_(PAD_BLOCK)
    out_indices[..., :take] = torch.where(keep, order[..., :take].to(torch.int32), PAD_BLOCK)
    out_counts.copy_(counts)
