"""How the T threads of a group share one sequence, and how split results merge.

    T == 1        one item: all KV heads, the whole of each block list
    T <= Hkv      contiguous KV-head ranges, balanced by listed blocks; each
                  thread writes its heads' rows of the output directly
    T >  Hkv      every thread takes 1/T of every head's block list (split t of
                  T) into a partial buffer; the partials merge by LSE

Splitting by head needs no merge, so it is preferred; block ranges are what is
left when there are more threads than KV heads (e.g. Hkv = 1 per TP rank).
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class WorkItem(NamedTuple):
    head_begin: int
    head_end: int
    split_index: int
    num_splits: int


def plan_work(counts_row: list[int], num_threads: int) -> list[WorkItem]:
    """Work items of one sequence for `num_threads` threads (at most one each).

    counts_row : blocks listed per KV head, [Hkv] python ints.
    Items whose num_splits > 1 must be merged with merge_partials().
    """
    num_kv_heads = len(counts_row)
    if num_threads == 1 or num_kv_heads == 0:
        return [WorkItem(0, num_kv_heads, 0, 1)]
    if num_threads > num_kv_heads:
        return [WorkItem(0, num_kv_heads, t, num_threads) for t in range(num_threads)]
    total = sum(counts_row)
    prefix = [0]
    for n in counts_row:
        prefix.append(prefix[-1] + n)
    bounds = [0]
    for t in range(1, num_threads):
        if total == 0:
            cut = num_kv_heads * t // num_threads
        else:
            target = total * t / num_threads
            # The head boundary whose prefix sum is closest to the target.
            cut = min(range(num_kv_heads + 1), key=lambda h: (abs(prefix[h] - target), h))
        bounds.append(max(cut, bounds[-1]))
    bounds.append(num_kv_heads)
    return [WorkItem(b0, b1, 0, 1) for b0, b1 in zip(bounds, bounds[1:]) if b1 > b0]


def merge_partials(
    partial_o: torch.Tensor, partial_lse: torch.Tensor, out_o: torch.Tensor, out_lse: torch.Tensor
) -> None:
    """Merge T partial results over disjoint key sets into out_o / out_lse.

    partial_o : [T, Hq, D] fp32; partial_lse : [T, Hq] fp32 natural log (-inf
    for an empty part). out_o : [Hq, D] (any float dtype); out_lse : [Hq] fp32.
    All parts empty gives o = 0, lse = -inf.
    """
    lse = torch.logsumexp(partial_lse, dim=0)  # [Hq]
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    weights = torch.exp(partial_lse - safe)  # [T, Hq]; 0 for empty parts
    out_o.copy_((weights.unsqueeze(-1) * partial_o).sum(dim=0))
    out_lse.copy_(lse)
