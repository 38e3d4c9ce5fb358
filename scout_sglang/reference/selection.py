"""Reference block digests, Quest scores, top-k selection and the resident split.

digest -> score -> select -> split: the fp32 ground truth for kernels.digest,
kernels.selection and the engine's CPU set. Per-request Python loops, no fusion.
"""

from __future__ import annotations

import torch

from scout_sglang.layout import PAD_BLOCK


def block_digests(k_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel min and max of K over each page's tokens, per KV head.

    k_cache : [P, Hkv, S, D] -> (kmin, kmax) each [P, Hkv, D] fp32.
    """
    kf = k_cache.float()
    return kf.amin(dim=2), kf.amax(dim=2)


def quest_scores(
    q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor, *, group_reduce: str = "max"
) -> torch.Tensor:
    """Upper bound of q.k over each block, aggregated over each GQA group.

    q : [Hq, D]; kmin, kmax : [n, Hkv, D] -> scores [Hkv, n] fp32.
    score(head, block) = sum_d max(q_d * kmin_d, q_d * kmax_d); the group's
    query heads are reduced by max (default) or sum.
    """
    num_qo_heads, head_dim = q.shape
    n, num_kv_heads, _ = kmin.shape
    group_size = num_qo_heads // num_kv_heads
    qf = q.float().view(num_kv_heads, group_size, 1, head_dim)
    lo = qf * kmin.float().permute(1, 0, 2).unsqueeze(1)  # [Hkv, G, n, D]
    hi = qf * kmax.float().permute(1, 0, 2).unsqueeze(1)
    per_head = torch.maximum(lo, hi).sum(-1)  # [Hkv, G, n]
    if group_reduce == "max":
        return per_head.amax(dim=1)
    if group_reduce == "sum":
        return per_head.sum(dim=1)
    raise ValueError(f"group_reduce must be 'max' or 'sum', got {group_reduce!r}")


def select_topk(
    scores: torch.Tensor, *, topk: int, num_sink_blocks: int = 0, num_local_blocks: int = 0
) -> list[int]:
    """Top-k blocks of one (request, KV head), best first.

    scores : [n] over the request's full blocks. The first `num_sink_blocks` and
    the last `num_local_blocks` are always chosen, ahead of the rest. Ties go to
    the lower block index. Returns min(topk, n) block indices, forced blocks
    first (ascending), then by score descending.
    """
    n = scores.shape[0]
    forced = sorted(set(range(min(num_sink_blocks, n))) | set(range(max(n - num_local_blocks, 0), n)))
    rest = [j for j in range(n) if j not in set(forced)]
    rest.sort(key=lambda j: (-float(scores[j]), j))
    return (forced + rest)[: min(topk, n)]


def split_selection(selected: list[int], resident: list[int], *, capacity: int) -> tuple[list[int], int]:
    """Selected blocks that are not resident, in selection order, capped.

    Returns (cpu_blocks[:capacity], number dropped past the capacity).
    """
    resident_set = set(resident)
    cpu = [j for j in selected if j not in resident_set and j != PAD_BLOCK]
    return cpu[:capacity], max(len(cpu) - capacity, 0)


def split_shares(cpu_blocks: list[int], cap: int) -> tuple[list[int], list[int]]:
    """The CPU split of a CPU list: (the workers' share, its first `cap` entries; the device's zero-copy share,
    the rest in order). Every listed block is in exactly one share."""
    cap = max(cap, 0)
    return cpu_blocks[:cap], cpu_blocks[cap:]
