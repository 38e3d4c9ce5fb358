"""Block digests (Quest): per-channel min/max of K over each page, per KV head.

First op of digest -> select -> device part / CPU part -> merge. Only the pages
named in `page_ids` are (re)computed, so a step digests just the blocks that
filled; every other row of the digest tensors is left as it was. The source
page and the destination row may differ (`rows`): a block that just filled is
read from the device window and digested into the row of its host page. With
the estimate of the unattended blocks on, the same program writes the page's
value summary into the same row of `value_summary` (kernels/value_summary.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from scout_sglang.kernels.triton.value_summary import store_value_summary, value_summary_rows


@triton.jit
def _block_digest_kernel(
    k_ptr,
    page_ids_ptr,
    rows_ptr,
    min_ptr,
    max_ptr,
    v_ptr,
    mean_ptr,
    stride_k_page,
    stride_k_head,
    stride_k_tok,
    stride_min_page,
    stride_min_head,
    stride_max_page,
    stride_max_head,
    stride_v_page,
    stride_v_head,
    stride_v_tok,
    stride_mean_page,
    stride_mean_head,
    stride_mean_part,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    VALUE_SUMMARY: tl.constexpr,
):
    # grid: (len(page_ids), Hkv); one program reduces one [S, D] run of one head.
    pid = tl.program_id(0)
    head = tl.program_id(1)
    page = tl.load(page_ids_ptr + pid).to(tl.int64)
    row = tl.load(rows_ptr + pid).to(tl.int64)

    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    mask = (offs_s[:, None] < BLOCK_SIZE) & mask_d[None, :]
    k_ptrs = (
        k_ptr + page * stride_k_page + head * stride_k_head
        + offs_s[:, None] * stride_k_tok + offs_d[None, :]
    )
    k = tl.load(k_ptrs, mask=mask, other=0.0).to(tl.float32)
    # min/max of low-precision values are exact in that precision, so reducing
    # in fp32 and casting back loses nothing.
    k_min = tl.min(tl.where(mask, k, float("inf")), axis=0)
    k_max = tl.max(tl.where(mask, k, float("-inf")), axis=0)

    tl.store(
        min_ptr + row * stride_min_page + head * stride_min_head + offs_d,
        k_min.to(min_ptr.dtype.element_ty),
        mask=mask_d,
    )
    tl.store(
        max_ptr + row * stride_max_page + head * stride_max_head + offs_d,
        k_max.to(max_ptr.dtype.element_ty),
        mask=mask_d,
    )
    if VALUE_SUMMARY:
        v = tl.load(v_ptr + page * stride_v_page + head * stride_v_head + offs_s[:, None] * stride_v_tok
                    + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
        mean, slope, axis = value_summary_rows(k, v, mask, mask_d, BLOCK_SIZE, HEAD_DIM)
        store_value_summary(mean_ptr + row * stride_mean_page + head * stride_mean_head + offs_d, stride_mean_part,
                            mean, slope, axis, mask_d)


def digests_triton(
    k_cache: torch.Tensor,
    page_ids: torch.Tensor,
    out_min: torch.Tensor,
    out_max: torch.Tensor,
    *,
    rows: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    out_value_summary: torch.Tensor | None = None,
) -> None:
    """Write the digests of the pages in `page_ids` into `out_min` / `out_max`.

    Parameters
    ----------
    k_cache : [P, Hkv, S, D] fp32/fp16/bf16, contiguous
    page_ids : [n] int32, page ids to digest
    out_min, out_max : [R, Hkv, D], cache dtype; row rows[i] (default:
        page_ids[i]) is overwritten with the per-channel min/max over the
        S tokens of page page_ids[i]; all other rows are untouched
    rows : optional [n] int32, distinct destination rows
    v_cache, out_value_summary : optional (together) [P, Hkv, S, D] and [R, Hkv, 3, D]: row rows[i] of
        out_value_summary gets the value summary of page page_ids[i] (computed in fp32)
    """
    num_ids = page_ids.shape[0]
    if num_ids == 0:
        return
    _, num_kv_heads, block_size, head_dim = k_cache.shape
    mean = out_value_summary is not None
    _block_digest_kernel[(num_ids, num_kv_heads)](
        k_cache,
        page_ids,
        page_ids if rows is None else rows,
        out_min,
        out_max,
        v_cache if mean else k_cache,  # unread without the mean
        out_value_summary if mean else out_min,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        out_min.stride(0),
        out_min.stride(1),
        out_max.stride(0),
        out_max.stride(1),
        *(v_cache.stride()[:3] if mean else (0, 0, 0)),
        *(out_value_summary.stride()[:3] if mean else (0, 0, 0)),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        BLOCK_S=triton.next_power_of_2(block_size),
        BLOCK_D=triton.next_power_of_2(head_dim),
        VALUE_SUMMARY=mean,
    )
