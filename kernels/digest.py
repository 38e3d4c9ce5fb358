"""Block digests: per-channel min and max of K per page and KV head (Quest), and the value summary of V.

First stage of digest -> select -> device part / CPU part -> merge. Digests are
stored per page in the cache dtype (min/max of bf16 values are exact in bf16),
1/S of the K cache each: [num_pages, Hkv, D] for the min and for the max.
With the estimate of the unattended blocks on (kernels/estimate.py), the same
pass writes each block's value summary (kernels/value_summary.py: mean value,
slope, axis), [num_pages, Hkv, 3, D] in the cache dtype too.
The engine digests through these functions only (`digest_blocks` for blocks
that fill, `update_digests` for the pages of a device-full store), so the
tests of this module cover the digests every mode selects with.
"""

from __future__ import annotations

import torch

from scout_sglang.kernels.checks import check_paged_cache, check_shape, check_tensor
from scout_sglang.kernels.dispatch import select_impl
from scout_sglang.kernels.value_summary import value_summaries_torch
from scout_sglang.layout import VALUE_SUMMARY_ROWS


def build_digests(
    k_cache: torch.Tensor, *, impl: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Digests of every page of a paged K cache.

    Parameters
    ----------
    k_cache : [P, Hkv, S, D], fp32/fp16/bf16, any device

    Returns
    -------
    digest_min, digest_max : [P, Hkv, D], dtype and device of k_cache
    """
    check_paged_cache(k_cache)
    num_pages, num_kv_heads, _, head_dim = k_cache.shape
    digest_min = torch.empty(num_pages, num_kv_heads, head_dim, dtype=k_cache.dtype, device=k_cache.device)
    digest_max = torch.empty_like(digest_min)
    page_ids = torch.arange(num_pages, dtype=torch.int32, device=k_cache.device)
    digests_into(k_cache, page_ids, digest_min, digest_max, impl)
    return digest_min, digest_max


def update_digests(
    k_cache: torch.Tensor,
    page_ids: torch.Tensor,
    digest_min: torch.Tensor,
    digest_max: torch.Tensor,
    *,
    rows: torch.Tensor | None = None,
    v_cache: torch.Tensor | None = None,
    value_summary: torch.Tensor | None = None,
    impl: str | None = None,
) -> None:
    """Recompute the digests of the pages that just filled, in place.

    Parameters
    ----------
    k_cache : [P, Hkv, S, D]
    page_ids : [n] int32, same device; rows of the digests to rewrite
    digest_min, digest_max : [P, Hkv, D], dtype of k_cache; other rows untouched
    rows : optional [n] int32, same device; the rows to write instead of page_ids
        (a fixed-length list may send pages with nothing to record to a scratch row)
    v_cache, value_summary : optional (together) [P, Hkv, S, D] and [P, Hkv, 3, D]: each page's value summary too
    """
    _check_digest_args(k_cache, "page_ids", page_ids, digest_min, digest_max, num_rows=digest_min.shape[0],
                       v_cache=v_cache, value_summary=value_summary)
    if rows is not None:
        check_tensor("rows", rows, ndim=1, dtypes=(torch.int32,), device=k_cache.device)
        check_shape("rows", rows, page_ids.shape)
    if page_ids.numel() == 0:
        return
    digests_into(k_cache, page_ids, digest_min, digest_max, impl, rows=rows, v_cache=v_cache,
                 value_summary=value_summary)


def digest_blocks(
    k_blocks: torch.Tensor,
    rows: torch.Tensor,
    digest_min: torch.Tensor,
    digest_max: torch.Tensor,
    *,
    v_blocks: torch.Tensor | None = None,
    value_summary: torch.Tensor | None = None,
    impl: str | None = None,
) -> None:
    """Digest blocks held outside the digests' page space into the given rows.

    Parameters
    ----------
    k_blocks : [n, Hkv, S, D], the keys of n full blocks (for example the
        device window pages of blocks that just filled)
    rows : [n] int32, same device; distinct rows of the digests to rewrite
        (the blocks' host pages)
    digest_min, digest_max : [R, Hkv, D], dtype of k_blocks; other rows untouched
    v_blocks, value_summary : optional (together) [n, Hkv, S, D] and [R, Hkv, 3, D]: the blocks' value summaries too
    """
    _check_digest_args(k_blocks, "rows", rows, digest_min, digest_max, num_rows=digest_min.shape[0],
                       v_cache=v_blocks, value_summary=value_summary)
    if rows.shape[0] != k_blocks.shape[0]:
        raise ValueError(f"rows must have one entry per block ({k_blocks.shape[0]}), got {rows.shape[0]}")
    if rows.numel() == 0:
        return
    sources = torch.arange(k_blocks.shape[0], dtype=torch.int32, device=k_blocks.device)
    digests_into(k_blocks, sources, digest_min, digest_max, impl, rows=rows, v_cache=v_blocks,
                 value_summary=value_summary)


def _check_digest_args(k_cache, index_name, index, digest_min, digest_max, *, num_rows, v_cache=None,
                       value_summary=None):
    check_paged_cache(k_cache)
    check_tensor(index_name, index, ndim=1, dtypes=(torch.int32,), device=k_cache.device)
    expected = (num_rows, k_cache.shape[1], k_cache.shape[3])
    for name, digest in (("digest_min", digest_min), ("digest_max", digest_max)):
        check_tensor(name, digest, ndim=3, dtypes=(k_cache.dtype,), device=k_cache.device)
        check_shape(name, digest, expected)
    if (v_cache is None) != (value_summary is None):
        raise ValueError("the values and value_summary go together: pass both or neither")
    if v_cache is not None:
        check_paged_cache(k_cache, v_cache)
        check_tensor("value_summary", value_summary, ndim=4, dtypes=(k_cache.dtype,), device=k_cache.device)
        check_shape("value_summary", value_summary, (num_rows, k_cache.shape[1], VALUE_SUMMARY_ROWS, k_cache.shape[3]))


def digests_into(k_cache, page_ids, digest_min, digest_max, impl, *, rows=None, v_cache=None, value_summary=None):
    """Digests of pages `page_ids` of k_cache into rows `rows` (default: the same ids); with v_cache, the value
    summary of each page into the same row of value_summary (computed in fp32, stored in the cache dtype)."""
    if select_impl("digests", k_cache.device.type, impl) == "triton":
        from scout_sglang.kernels.triton import digests_triton

        digests_triton(k_cache, page_ids, digest_min, digest_max, rows=rows, v_cache=v_cache,
                       out_value_summary=value_summary)
        return
    index = page_ids.long()
    pages = k_cache.index_select(0, index)
    rows = (page_ids if rows is None else rows).long()
    digest_min.index_copy_(0, rows, pages.amin(dim=2))
    digest_max.index_copy_(0, rows, pages.amax(dim=2))
    if value_summary is not None:
        summaries = value_summaries_torch(pages, v_cache.index_select(0, index))
        value_summary.index_copy_(0, rows, summaries.to(value_summary.dtype))
