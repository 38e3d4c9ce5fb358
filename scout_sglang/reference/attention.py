"""Reference decode attention: dense, sparse over a block list, and the LSE merge.

The fp32 ground truth for the device part (kernels.sparse_decode), the CPU part
(cpu_worker) and the merge (kernels.merge_attention_states). Written for
clarity: Python loops over requests and heads, no fusion. LSE is natural log.
"""

from __future__ import annotations

import torch

from scout_sglang.layout import PAD_BLOCK


def dense_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one query token over a contiguous KV sequence.

    Parameters
    ----------
    q : [Hq, D]
    k, v : [N, Hkv, D]  (N may be 0)
    scale : softmax scale

    Returns
    -------
    o : [Hq, D] fp32 (zeros where N == 0)
    lse : [Hq] fp32, natural log of sum(exp(scale * q.k)); -inf where N == 0
    """
    num_qo_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group_size = num_qo_heads // num_kv_heads
    qf = q.float().view(num_kv_heads, group_size, head_dim)
    kf = k.float().permute(1, 2, 0)  # [Hkv, D, N]
    vf = v.float().permute(1, 0, 2)  # [Hkv, N, D]
    logits = torch.matmul(qf, kf) * scale  # [Hkv, G, N]
    if k.shape[0] == 0:
        o = torch.zeros(num_qo_heads, head_dim, dtype=torch.float32)
        lse = torch.full((num_qo_heads,), float("-inf"))
        return o, lse
    lse = torch.logsumexp(logits, dim=-1)  # [Hkv, G]
    probs = torch.exp(logits - lse.unsqueeze(-1))
    o = torch.matmul(probs, vf)  # [Hkv, G, D]
    return o.reshape(num_qo_heads, head_dim), lse.reshape(num_qo_heads)


def gather_head_tokens(
    cache: torch.Tensor, pages: list[int], head: int, last_block_len: int | None = None
) -> torch.Tensor:
    """Tokens of one KV head from a list of pages, in list order -> [n_tokens, D].

    cache : [num_pages, Hkv, S, D]; the last page keeps only `last_block_len`
    tokens when given.
    """
    block_size, head_dim = cache.shape[2], cache.shape[3]
    rows = []
    for i, page in enumerate(pages):
        take = block_size
        if last_block_len is not None and i == len(pages) - 1:
            take = last_block_len
        rows.append(cache[page, head, :take].float())
    if not rows:
        return torch.zeros(0, head_dim)
    return torch.cat(rows)


def sparse_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    counts: torch.Tensor,
    *,
    scale: float,
    last_block_len: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of one query token per request over per-KV-head block lists.

    Parameters
    ----------
    q : [B, Hq, D]
    k_cache, v_cache : [P, Hkv, S, D]
    block_table : [B, Hkv, C] int, page ids; entries at or past `counts` ignored
    counts : [B, Hkv] int
    last_block_len : [B, Hkv] int or None; tokens valid in the last listed
        block of each list (the partial tail), all others are full

    Returns
    -------
    o : [B, Hq, D] fp32, lse : [B, Hq] fp32 natural log (-inf for empty lists)
    """
    batch_size, num_qo_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group_size = num_qo_heads // num_kv_heads
    o = torch.zeros(batch_size, num_qo_heads, head_dim)
    lse = torch.full((batch_size, num_qo_heads), float("-inf"))
    for b in range(batch_size):
        for h in range(num_kv_heads):
            n = int(counts[b, h])
            pages = [int(p) for p in block_table[b, h, :n]]
            assert all(p != PAD_BLOCK for p in pages), "padding inside the counted part"
            tail = None if last_block_len is None else int(last_block_len[b, h])
            k = gather_head_tokens(k_cache, pages, h, tail)
            v = gather_head_tokens(v_cache, pages, h, tail)
            heads = slice(h * group_size, (h + 1) * group_size)
            o_h, lse_h = dense_decode(q[b, heads], k.unsqueeze(1), v.unsqueeze(1), scale=scale)
            o[b, heads], lse[b, heads] = o_h, lse_h
    return o, lse


def merge_states(
    o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention results over disjoint key sets.

    o_* : [..., H, D]; lse_* : [..., H] fp32 natural log. An empty side has
    lse = -inf and leaves the other unchanged; both empty gives o = 0, lse = -inf.
    """
    lse_a, lse_b = lse_a.float(), lse_b.float()
    m = torch.maximum(lse_a, lse_b)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w_a = torch.exp(lse_a - m_safe)
    w_b = torch.exp(lse_b - m_safe)
    total = w_a + w_b
    o = (w_a.unsqueeze(-1) * o_a.float() + w_b.unsqueeze(-1) * o_b.float()) / torch.where(
        total > 0, total, torch.ones_like(total)
    ).unsqueeze(-1)
    lse = torch.where(total > 0, m_safe + torch.log(total), torch.full_like(m, float("-inf")))
    return o, lse


def dense_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
    """Causal attention of the last N tokens of a sequence over the whole sequence.

    q : [N, Hq, D], the queries of positions M-N .. M-1
    k, v : [M, Hkv, D], M >= N (the first M-N tokens are an earlier prefix)
    Returns o : [N, Hq, D] fp32.
    """
    num_new, num_total = q.shape[0], k.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float32)
    for i in range(num_new):
        visible = num_total - num_new + i + 1
        out[i] = dense_decode(q[i], k[:visible], v[:visible], scale=scale)[0]
    return out
