"""The torch path of the CPU part: gather the listed blocks, then torch's flash kernel.

Serves where the native kernel cannot be built: the
blocks of each KV head are gathered into a per-thread preallocated buffer
(index_select with out=), and the G query heads of a KV head are folded into
the query-length axis (q [1, Hkv, G, D]), which torch's CPU flash attention
runs ~9x faster than GQA passed directly. Same call contract as NativeKernel.
"""

from __future__ import annotations

import torch


class GatherScratch:
    """Per-thread K/V gather buffers, grown on demand and reused across tasks."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def take(self, which: str, rows: int, block_size: int, head_dim: int, dtype: torch.dtype) -> torch.Tensor:
        """A contiguous [rows, S, D] view of the buffer `which` ("k" or "v")."""
        numel = rows * block_size * head_dim
        buf = self._buffers.get((which, dtype))
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype)
            self._buffers[(which, dtype)] = buf
        return buf[:numel].view(rows, block_size, head_dim)


class TorchKernel:
    """Pure-torch implementation of the decode task (see NativeKernel.decode)."""

    name = "torch"
    isa = "torch"

    def new_scratch(self) -> GatherScratch:
        return GatherScratch()

    def decode(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        counts: torch.Tensor,
        *,
        batch_index: int,
        out_o: torch.Tensor,
        out_lse: torch.Tensor,
        out_index: int,
        scale: float,
        head_begin: int,
        head_end: int,
        split_index: int,
        num_splits: int,
        scratch: GatherScratch,
    ) -> None:
        num_qo_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads = k_cache.shape[1]
        group_size = num_qo_heads // num_kv_heads
        ranges = []  # (head, first block, end block) in each head's list
        for head, n in enumerate(counts[batch_index, head_begin:head_end].tolist(), start=head_begin):
            ranges.append((head, n * split_index // num_splits, n * (split_index + 1) // num_splits))
        o_rows, lse_rows = out_o[out_index], out_lse[out_index]  # [Hq, D], [Hq]
        spans = {(lo, hi) for _, lo, hi in ranges}
        if len(spans) == 1 and ranges[0][2] > ranges[0][1]:
            # Every head takes the same slice of its list: one batched call.
            groups = [(head_begin, head_end, ranges[0][1], ranges[0][2])]
        else:
            groups = [(h, h + 1, lo, hi) for h, lo, hi in ranges]
        for h0, h1, lo, hi in groups:
            heads = slice(h0 * group_size, h1 * group_size)
            if hi == lo:
                # An empty list: o = 0, lse = -inf, without calling the op.
                o_rows[heads].zero_()
                lse_rows[heads].fill_(float("-inf"))
                continue
            pages = block_table[batch_index, h0:h1, lo:hi].long()  # [Hr, n]
            # (page, head) -> row of the cache viewed as [P * Hkv, S, D].
            rows = (pages * num_kv_heads + torch.arange(h0, h1).unsqueeze(1)).view(-1)
            k, v = self._gather(k_cache, v_cache, rows, scratch)
            num_heads, tokens = h1 - h0, (hi - lo) * k_cache.shape[2]
            q_fold = q[batch_index, heads].view(1, num_heads, group_size, head_dim)
            o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q_fold,
                k.view(1, num_heads, tokens, head_dim),
                v.view(1, num_heads, tokens, head_dim),
                scale=scale,
            )
            o_rows[heads].copy_(o.reshape(-1, head_dim))
            lse_rows[heads].copy_(lse.reshape(-1))

    @staticmethod
    def _gather(
        k_cache: torch.Tensor, v_cache: torch.Tensor, rows: torch.Tensor, scratch: GatherScratch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        num_pages, num_kv_heads, block_size, head_dim = k_cache.shape
        flat = (num_pages * num_kv_heads, block_size, head_dim)
        k = scratch.take("k", rows.numel(), block_size, head_dim, k_cache.dtype)
        v = scratch.take("v", rows.numel(), block_size, head_dim, v_cache.dtype)
        torch.index_select(k_cache.view(flat), 0, rows, out=k)
        torch.index_select(v_cache.view(flat), 0, rows, out=v)
        return k, v
