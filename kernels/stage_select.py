"""The select stage of the decode step: top-k per (request, KV head), the change count, quest's page lists.

digest -> score -> **select** -> split -> device part / CPU part -> merge -> recall.
One call per layer and step, after score_blocks: on CUDA one Triton launch
(triton/stage_select.py), on the CPU a fixed sequence of torch ops. Both follow
the policy of selection.select_topk (forced sink and local blocks first in
ascending order, then by score, ties to the lower block) and its reference
(scout_sglang.reference.select_topk), which the tests compare them with.

Optional parts, each enabled by passing its tensors:
- change count: `previous` [slots, Hkv, K] holds each request slot's last selection; the stage counts the
  selected blocks it did not hold (CHANGED) among those it can compare (COMPARED), then stores the new one;
- counters: a [NUM_COUNTERS] int32 row (step_counters.py) that gets SELECTED, CHANGED and COMPARED added;
- each row's own k: `row_topk` [B] int32 (<= topk, the outputs' width) cuts a row's selection to its first
  row_topk blocks of the policy's order (resident-first serving: a request that fits selects every block);
- quest pages: `page_table` [B, NB] maps blocks to device pages; `pages` [B, Hkv, K + 1] gets the pages of the
  selection followed by the partial tail's page, `page_counts` [B, Hkv] their number.
"""

from __future__ import annotations

import torch
from scout_sglang.kernels.checks import check_shape, check_tensor
from scout_sglang.kernels.dispatch import select_impl
from scout_sglang.kernels.selection import select_topk_into
from scout_sglang.kernels.step_counters import CHANGED, COMPARED, NUM_COUNTERS, SELECTED

from scout_sglang.layout import PAD_BLOCK


def select_blocks(scores: torch.Tensor, num_full: torch.Tensor, *, topk: int, num_sink_blocks: int,
                  num_local_blocks: int, out_selected: torch.Tensor, out_counts: torch.Tensor,
                  previous: torch.Tensor | None = None, slots: torch.Tensor | None = None,
                  counters: torch.Tensor | None = None, page_table: torch.Tensor | None = None,
                  num_tokens: torch.Tensor | None = None, block_size: int = 0, out_pages: torch.Tensor | None = None,
                  out_page_counts: torch.Tensor | None = None, row_topk: torch.Tensor | None = None,
                  impl: str | None = None, validate: bool = True) -> None:
    """Top-k blocks of every (request, KV head), written into the given outputs.

    Parameters
    ----------
    scores : [B, Hkv, NB] fp32, -inf past num_full (score_blocks); rows may be strided views
    num_full : [B] int32, full blocks per request (<= NB)
    topk, num_sink_blocks, num_local_blocks : K and the forced blocks (K >= sink + local)
    out_selected : [B, Hkv, K] int32, logical blocks best first, PAD_BLOCK past the count
    out_counts : [B, Hkv] int32 = min(K, num_full, row_topk)
    previous : optional [slots, Hkv, K] int32 last selections by request slot; slots : [B] int64 (both or neither)
    counters : optional [NUM_COUNTERS] int32
    page_table, num_tokens, block_size, out_pages, out_page_counts : the quest page lists (all or none):
        [B, NB] int32 device pages, [B] int32 tokens (the tail is partial when num_tokens % block_size),
        [B, Hkv, K + 1] int32 and [B, Hkv] int32
    row_topk : optional [B] int32 each row's k (<= K)
    validate : check the arguments (the decode step checks its static buffers once and passes False)
    """
    if validate:
        _check(scores, num_full, topk, num_sink_blocks, num_local_blocks, out_selected, out_counts, previous, slots,
               counters, page_table, num_tokens, block_size, out_pages, out_page_counts, row_topk)
    if select_impl("select_blocks", scores.device.type, impl) == "triton":
        from scout_sglang.kernels.triton.stage_select import select_topk_triton

        select_topk_triton(scores, num_full, out_selected, out_counts, topk=topk, num_sink_blocks=num_sink_blocks,
                           num_local_blocks=num_local_blocks, previous=previous, slots=slots, counters=counters,
                           page_table=page_table, num_tokens=num_tokens, block_size=block_size, pages=out_pages,
                           page_counts=out_page_counts, row_topk=row_topk)
        return
    select_topk_into(scores, num_full, topk, num_sink_blocks, num_local_blocks, out_selected, out_counts, row_topk)
    if counters is not None:
        counters[SELECTED] += out_counts.sum(dtype=torch.int32)
    if previous is not None:
        _count_changes(out_selected, previous, slots, counters)
    if out_pages is not None:
        _quest_pages(out_selected, out_counts, page_table, num_full, num_tokens, block_size, out_pages,
                     out_page_counts)


def _count_changes(selected, previous, slots, counters):
    """Selected blocks that the previous step of the same request did not select; the new selection is kept."""
    slots = slots.long()
    before = previous[slots]
    now = selected != PAD_BLOCK
    held = (selected.unsqueeze(-1) == before.unsqueeze(-2)) & (before != PAD_BLOCK).unsqueeze(-2)
    compared = now & (before != PAD_BLOCK).any(dim=-1, keepdim=True)
    if counters is not None:
        counters[COMPARED] += compared.sum(dtype=torch.int32)
        counters[CHANGED] += (compared & ~held.any(dim=-1)).sum(dtype=torch.int32)
    previous.index_copy_(0, slots, torch.where(now.any(dim=-1, keepdim=True), selected, before))


def _quest_pages(selected, counts, page_table, num_full, num_tokens, block_size, out_pages, out_page_counts):
    batch_size, _, topk = selected.shape
    pages = page_table.gather(1, selected.clamp(min=0).view(batch_size, -1).long()).view_as(selected)
    last_column = page_table.shape[1] - 1
    tail_page = page_table.gather(1, num_full.clamp(max=last_column).view(-1, 1).long()).view(batch_size, 1)
    has_tail = (num_tokens % block_size != 0).view(batch_size, 1)
    rank = torch.arange(topk + 1, device=selected.device)
    count = counts.unsqueeze(-1)
    pages = torch.cat([pages, pages[..., :1]], dim=-1)
    tail = (rank == count) & has_tail.unsqueeze(-1)
    out_pages.copy_(torch.where(rank < count, pages, torch.where(tail, tail_page.unsqueeze(-1), PAD_BLOCK)))
    out_page_counts.copy_(counts + has_tail.to(torch.int32))


def _check(scores, num_full, topk, sink, local, out_selected, out_counts, previous, slots, counters, page_table,
           num_tokens, block_size, out_pages, out_page_counts, row_topk):
    check_tensor("scores", scores, ndim=3, dtypes=(torch.float32,), contiguous="rows")
    device = scores.device
    batch_size, num_kv_heads, max_blocks = scores.shape
    check_tensor("num_full", num_full, ndim=1, dtypes=(torch.int32,), device=device, contiguous=False)
    check_shape("num_full", num_full, (batch_size,))
    if row_topk is not None:
        check_tensor("row_topk", row_topk, ndim=1, dtypes=(torch.int32,), device=device, contiguous=False)
        check_shape("row_topk", row_topk, (batch_size,))
    if topk < 1 or sink < 0 or local < 0 or topk < sink + local:
        raise ValueError(f"topk ({topk}) must be >= 1 and cover sink ({sink}) + local ({local}) blocks, all >= 0")
    check_tensor("out_selected", out_selected, dtypes=(torch.int32,), device=device, contiguous="rows")
    check_shape("out_selected", out_selected, (batch_size, num_kv_heads, topk))
    check_tensor("out_counts", out_counts, dtypes=(torch.int32,), device=device, contiguous="rows")
    check_shape("out_counts", out_counts, (batch_size, num_kv_heads))
    if (previous is None) != (slots is None):
        raise ValueError("previous and slots go together: pass both or neither")
    if previous is not None:
        check_tensor("previous", previous, ndim=3, dtypes=(torch.int32,), device=device)
        if previous.shape[1:] != (num_kv_heads, topk):
            raise ValueError(f"previous must be [slots, {num_kv_heads}, {topk}], got {tuple(previous.shape)}")
        check_tensor("slots", slots, ndim=1, dtypes=(torch.int32, torch.int64), device=device, contiguous=False)
        check_shape("slots", slots, (batch_size,))
    if counters is not None:
        check_tensor("counters", counters, dtypes=(torch.int32,), device=device)
        check_shape("counters", counters, (NUM_COUNTERS,))
    quest = (page_table, num_tokens, out_pages, out_page_counts)
    if any(t is not None for t in quest):
        if any(t is None for t in quest) or block_size < 1:
            raise ValueError("quest pages need page_table, num_tokens, out_pages, out_page_counts and block_size >= 1")
        check_tensor("page_table", page_table, ndim=2, dtypes=(torch.int32,), device=device, contiguous="rows")
        if page_table.shape[0] != batch_size or page_table.shape[1] < max_blocks:
            raise ValueError(f"page_table must be [{batch_size}, >= {max_blocks}], got {tuple(page_table.shape)}")
        check_tensor("num_tokens", num_tokens, ndim=1, dtypes=(torch.int32,), device=device, contiguous=False)
        check_tensor("out_pages", out_pages, dtypes=(torch.int32,), device=device, contiguous="rows")
        check_shape("out_pages", out_pages, (batch_size, num_kv_heads, topk + 1))
        check_tensor("out_page_counts", out_page_counts, dtypes=(torch.int32,), device=device, contiguous="rows")
        check_shape("out_page_counts", out_page_counts, (batch_size, num_kv_heads))
